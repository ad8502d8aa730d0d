"""Where the CPU of an epoch goes, for ``python -m bench fanout``: this process, the
proxies, the influxd servers, the staging store's backends, and the whole machine.

A ratio below target says little by itself on a two-core machine shared with
other work: the machine's busy time over the same span says whether the cores
were the bound (about 2 cores busy), and the groups say whose work it was.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from bench.cpu import backend_pids, process_cpu_s

_GROUPS = ("wall", "client", "proxies", "influxd", "postgres", "machine")
_TICKS = os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """CPU seconds the machine's cores spent busy since boot (all processes)."""
    with open("/proc/stat") as handle:
        fields = [int(x) for x in handle.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / _TICKS


class Meter:
    """CPU seconds by group over measured blocks; ``samples`` holds one dict per block
    (``wall`` too), by the name given to :meth:`measure`."""

    def __init__(
        self, conninfo: str, prefix: str, proxies: Sequence[int], influxd: Sequence[int]
    ) -> None:
        self._conninfo, self._prefix = conninfo, prefix
        self._proxies, self._influxd = tuple(proxies), tuple(influxd)
        self.samples: dict[str, list[dict[str, float]]] = {}

    def _sample(self, backends: Sequence[int]) -> dict[str, float]:
        return {
            "client": time.process_time(),
            "proxies": sum(process_cpu_s(pid) for pid in self._proxies),
            "influxd": sum(process_cpu_s(pid) for pid in self._influxd),
            "postgres": sum(process_cpu_s(pid) for pid in backends),
            "machine": machine_busy_s(),
            "wall": time.perf_counter(),
        }

    @contextmanager
    def measure(self, name: str, per: int = 1) -> Iterator[None]:
        """Sample around the block; the differences divided by ``per`` (epochs)."""
        backends = backend_pids(self._conninfo, self._prefix)  # off the block's clock
        before = self._sample(backends)
        yield
        after = self._sample(backends)
        spent = {k: (after[k] - before[k]) / per for k in before}
        self.samples.setdefault(name, []).append(spent)

    def medians(self) -> dict[str, dict[str, float]]:
        """Per name: the median CPU seconds of each group per epoch, and the machine's
        busy cores over the blocks (its busy seconds over their wall seconds)."""
        out = {}
        for name, samples in self.samples.items():
            row = {g: round(statistics.median(s[g] for s in samples), 3) for g in _GROUPS}
            busy = sum(s["machine"] for s in samples) / sum(s["wall"] for s in samples)
            out[name] = {**row, "busy_cores": round(busy, 2), "n": len(samples)}
        return out
