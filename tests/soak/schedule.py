"""A seeded, replayable schedule of overlapping faults for the soak (pure: no I/O).

The same seed, fault count, span and sink count give the same schedule, which
the soak prints first, so a failure replays with ``--seed``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

DRIVER_KILL = "driver_kill"  # SIGKILL of a job's whole session: driver, JVM, workers
EXECUTOR_KILL = "executor_kill"  # SIGKILL of a job's Python workers: Spark retries tasks
INFLUX_STOP = "influx_stop"  # InfluxDB stopped, started again after the duration
PROXY_STALL = "proxy_stall"  # requests to InfluxDB swallowed (read timeouts)
PROXY_CUT = "proxy_cut"  # connections to InfluxDB reset
PG_FAST = "pg_fast"  # PostgreSQL stopped in fast mode, started again
PG_IMMEDIATE = "pg_immediate"  # PostgreSQL's crash-like stop, started again
PG_TERMINATE = "pg_terminate"  # pg_terminate_backend of every twophase connection
KINDS = (
    DRIVER_KILL,
    EXECUTOR_KILL,
    INFLUX_STOP,
    PROXY_STALL,
    PROXY_CUT,
    PG_FAST,
    PG_IMMEDIATE,
    PG_TERMINATE,
)
PER_SINK = (DRIVER_KILL, EXECUTOR_KILL)  # the others hit the shared servers
# The retry deadlines the soak gives its jobs (InfluxDB promotion and staging steps).
DEADLINE_S = 20.0
# Outage lengths (s): most shorter than the deadlines (ridden out inside the batch);
# the long ones outlast them (the query fails, its supervisor restarts it, recovery).
_DURATIONS = {
    INFLUX_STOP: (2.0, 12.0),
    PROXY_STALL: (2.0, 8.0),
    PROXY_CUT: (1.0, 6.0),
    PG_FAST: (0.0, 4.0),
    PG_IMMEDIATE: (0.0, 4.0),
}
OUTAGES = tuple(_DURATIONS)
LONG = (DEADLINE_S + 6.0, DEADLINE_S + 14.0)


@dataclass(frozen=True)
class Fault:
    """``kind`` at ``at_s`` seconds into the schedule, for ``duration_s`` (outages), on
    sink number ``sink`` (the per-sink kinds)."""

    at_s: float
    kind: str
    sink: int | None = None
    duration_s: float = 0.0

    def describe(self) -> str:
        target = f" sink {self.sink}" if self.sink is not None else ""
        length = f" for {self.duration_s:.1f}s" if self.duration_s else ""
        length += " (outlasts the retry deadlines)" if self.duration_s > DEADLINE_S else ""
        return f"t+{self.at_s:6.1f}s {self.kind}{target}{length}"


def make_schedule(
    seed: int, faults: int, span_s: float, sinks: int, long_outages: int | None = None
) -> list[Fault]:
    """``faults`` faults spread at random over ``span_s`` seconds, in time order.

    Every kind comes at least once when ``faults`` allows (the first ones are a
    shuffled round of all kinds), then kinds at random. Times are independent, so
    faults overlap. ``long_outages`` of the outages (default: one in five, at least
    one) last longer than :data:`DEADLINE_S`.
    """
    if faults < 0 or span_s <= 0 or sinks < 1:
        raise ValueError("faults >= 0, span_s > 0 and sinks >= 1")
    rng = random.Random(seed)
    kinds = list(KINDS)
    rng.shuffle(kinds)
    chosen = kinds[:faults] + [rng.choice(KINDS) for _ in range(faults - len(kinds))]
    outages = [i for i, kind in enumerate(chosen) if kind in OUTAGES]
    count = max(1, round(len(outages) / 5)) if long_outages is None else long_outages
    long = set(rng.sample(outages, min(count, len(outages))))
    schedule = [_fault(rng, kind, span_s, sinks, i in long) for i, kind in enumerate(chosen)]
    return sorted(schedule, key=lambda fault: fault.at_s)


def _fault(rng: random.Random, kind: str, span_s: float, sinks: int, long: bool) -> Fault:
    low, high = LONG if long else _DURATIONS.get(kind, (0.0, 0.0))
    return Fault(
        at_s=round(rng.uniform(0.0, span_s), 1),
        kind=kind,
        sink=rng.randrange(sinks) if kind in PER_SINK else None,
        duration_s=round(rng.uniform(low, high), 1),
    )


def describe(seed: int, schedule: list[Fault]) -> str:
    lines = [f"soak schedule, seed {seed}: {len(schedule)} faults"]
    return "\n".join(lines + ["  " + fault.describe() for fault in schedule])
