"""CPU seconds per process group: this process, a job's process tree, PostgreSQL, InfluxDB.

On a two-core machine every side is CPU-bound, so where the CPU goes explains the
wall time better than the wall time itself, and is less disturbed by other load.

* ``client``: this process (all threads), for the scenarios that run in it;
* ``driver``, ``jvm``, ``python_workers``: a job's processes, ``spark-submit``'s JVM,
  the Python driver it starts, and Spark's Python workers (told apart by command line);
* ``postgres``: the backends connected to the run's scratch databases (not the WAL
  writer or the checkpointer);
* ``influxd``: the whole dev InfluxDB process (shared with anyone else writing to it).

A process tree and the backends are sampled every :data:`PERIOD_S`, keeping each
process's last reading: a process's last period before it exits can be missed.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

_TICKS = os.sysconf("SC_CLK_TCK")
PERIOD_S = 0.1


def _stat(pid: int) -> tuple[str, int, float] | None:
    """(command name, parent pid, user + system CPU seconds) of a process, or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = text[text.index("(") + 1 : text.rindex(")")]
    fields = text.rsplit(")", 1)[1].split()
    return name, int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (0 when it is gone or unreadable)."""
    found = _stat(pid)
    return found[2] if found else 0.0


def influxd_pid() -> int | None:
    """The development influxd (devkit's ``default_servers``), else the one influxd
    running here, or None."""
    try:
        from devkit import default_servers

        found = default_servers()[1].pid()
    except ImportError:
        found = None
    if found is None:
        named = [int(e.name) for e in os.scandir("/proc") if e.name.isdigit() and _named(e.name)]
        found = named[0] if len(named) == 1 else None
    return found


def _named(pid: str, name: str = "influxd") -> bool:
    stat = _stat(int(pid))
    return stat is not None and stat[0] == name


def _group(pid: int, name: str) -> str:
    """A job's process by what it runs: the JVM, Spark's Python workers (the daemon
    and the workers it forks, which keep its command line), else the Python driver
    (or the launcher script before it becomes the JVM)."""
    if name == "java":
        return "jvm"
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "driver"
    return (
        "python_workers"
        if b"pyspark.daemon" in cmdline or b"pyspark.worker" in cmdline
        else "driver"
    )


def _tree(root: int) -> dict[int, str]:
    """Every live descendant of ``root`` (and ``root``) with its group."""
    parents: dict[int, tuple[int, str]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (found := _stat(int(entry.name))):
            parents[int(entry.name)] = (found[1], found[0])
    members = {root}
    grew = True
    while grew:
        grew = False
        for pid, (parent, _) in parents.items():
            if pid not in members and parent in members:
                members.add(pid)
                grew = True
    return {pid: _group(pid, parents[pid][1]) for pid in members if pid in parents}


class Sampler:
    """Samples the run's PostgreSQL backends (and a job's process tree from ``root``)
    on a thread until :meth:`stop`, which gives CPU seconds per group spent since the
    start: ``client`` (this process) when there is no ``root``, ``influxd`` as a
    difference. A backend connected before the start counts from its reading then."""

    def __init__(self, conninfo: str, prefix: str, root: int | None = None) -> None:
        self._root, self._conninfo, self._prefix = root, conninfo, prefix
        self._conn = psycopg.connect(conninfo, autocommit=True)
        self._base = {pid: cpu for pid, (_, cpu) in self._read().items()}
        self._last: dict[int, tuple[str, float]] = {}
        self._influxd = influxd_pid()
        self._influxd_start = process_cpu_s(self._influxd) if self._influxd else 0.0
        self._client_start = time.process_time()
        self._own_s = 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _read(self) -> dict[int, tuple[str, float]]:
        rows = self._conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname LIKE %s AND pid <> pg_backend_pid()",
            (self._prefix + "%",),
        ).fetchall()
        watched = {int(row[0]): "postgres" for row in rows}
        watched |= _tree(self._root) if self._root is not None else {}
        return {pid: (group, process_cpu_s(pid)) for pid, group in watched.items()}

    def _loop(self) -> None:
        while not self._done.wait(PERIOD_S):
            self._last |= {pid: seen for pid, seen in self._read().items() if seen[1]}
        self._own_s = time.thread_time()  # the sampling's own CPU, not the client's

    def stop(self) -> dict[str, float]:
        self._done.set()
        self._thread.join()
        self._last |= {pid: seen for pid, seen in self._read().items() if seen[1]}
        self._conn.close()
        totals = dict.fromkeys(("driver", "jvm", "python_workers") if self._root else (), 0.0)
        totals["postgres"] = 0.0
        for pid, (group, cpu) in self._last.items():
            totals[group] = totals.get(group, 0.0) + cpu - self._base.get(pid, 0.0)
        if self._root is None:
            totals["client"] = time.process_time() - self._client_start - self._own_s
        end = process_cpu_s(self._influxd) if self._influxd else 0.0
        totals["influxd"] = end - self._influxd_start
        return {k: round(v, 3) for k, v in totals.items()}


class CpuMeter:
    """CPU seconds of this process, the run's PostgreSQL backends and influxd over a
    block run in this process (``with meter.measure() as cpu:``)."""

    def __init__(self, conninfo: str, prefix: str) -> None:
        self._conninfo, self._prefix = conninfo, prefix

    @contextmanager
    def measure(self) -> Iterator[dict[str, float]]:
        spent: dict[str, float] = {}
        sampler = Sampler(self._conninfo, self._prefix)
        yield spent
        spent.update(sampler.stop())
