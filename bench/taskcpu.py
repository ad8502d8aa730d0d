"""CPU seconds of single-threaded processes (PostgreSQL backends) to the nanosecond.

``/proc/<pid>/stat`` counts in clock ticks (10 ms here): a backend that COPYs
100k points spends a few ticks, so a per-point figure from it is mostly
rounding. ``/proc/<pid>/schedstat`` gives the time on the CPU in nanoseconds, of
the process's main thread only, which is all of a PostgreSQL backend.
"""

from __future__ import annotations

from collections.abc import Iterable


def task_cpu_s(pid: int) -> float:
    """Seconds the process's main thread ran on a CPU (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/schedstat") as handle:
            return int(handle.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def tasks_cpu_s(pids: Iterable[int]) -> float:
    return sum(task_cpu_s(pid) for pid in pids)
