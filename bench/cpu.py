"""CPU seconds spent by the client, its PostgreSQL backends and influxd during a run.

On a two-core machine every side is CPU-bound, so where the CPU goes explains
the throughput better than wall time, and is less disturbed by other load.
``client`` is this process (all threads); ``postgres`` the backends connected
to the bench's staging databases (not the WAL writer or checkpointer);
``influxd`` the whole server process (shared with anyone else writing to it).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (0 when it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS


def influxd_pid() -> int | None:
    """The development influxd (devkit's ``default_servers``), or None."""
    try:
        from devkit import default_servers
    except ImportError:
        return None
    return default_servers()[1].pid()


def backend_pids(conninfo: str, prefix: str) -> list[int]:
    """PostgreSQL backends connected to the databases whose names start with ``prefix``."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname LIKE %s AND pid <> pg_backend_pid()",
            (prefix + "%",),
        ).fetchall()
    return [int(row[0]) for row in rows]


class CpuMeter:
    """Accumulates CPU seconds per group over measured blocks (``with meter.measure():``)."""

    def __init__(self, conninfo: str, prefix: str) -> None:
        self._conninfo, self._prefix = conninfo, prefix
        self._influxd = influxd_pid()

    def _sample(self, backends: list[int]) -> dict[str, float]:
        return {
            "client": time.process_time(),
            "postgres": sum(process_cpu_s(pid) for pid in backends),
            "influxd": process_cpu_s(self._influxd) if self._influxd else 0.0,
        }

    @contextmanager
    def measure(self, into: list[dict[str, float]]) -> Iterator[None]:
        backends = backend_pids(self._conninfo, self._prefix)
        before = self._sample(backends)
        yield
        after = self._sample(backends)
        into.append({k: round(after[k] - before[k], 3) for k in before})
