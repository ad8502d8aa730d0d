"""Loopback throughput: one epoch through twophase (stage, then commit: recover, decide,
promote, mark) against the same points POSTed straight to InfluxDB by what a user
writes instead, over one connection and over four at once (as four partitions would).

Cases: epoch sizes. Figures: the epoch's wall seconds and the CPU seconds of this
process, the staging backends and influxd. Each epoch has points of its own (a fresh
seed), built before the clock starts.
"""

from __future__ import annotations

from typing import Any

from bench.harness.scenario import Context, Figures, Scenario, in_process, timed
from bench.harness.sides import DirectSide, TwoPhaseSide, epoch_lines
from twophase.protocol.commit.runtime import TwoPhase

SIDES = ("twophase", "direct", "direct_4")


def make(ctx: Context) -> dict[str, Any]:
    """The sides, opened once per run of the scenario (closed by the harness)."""
    tp = TwoPhase.open(ctx.scratch.config("main", "tp"))
    made: dict[str, Any] = {
        "twophase": TwoPhaseSide(tp, "bench-throughput"),
        "direct": DirectSide(ctx.scratch.influx("direct")),
        "direct_4": DirectSide(ctx.scratch.influx("direct"), connections=4),
    }
    ctx.closers += [tp.close, made["direct"].close, made["direct_4"].close]
    return made


def run(ctx: Context, side: str, size: int) -> Figures:
    runner = in_process(ctx, make)[side]
    lines = epoch_lines(size, ctx.fresh())
    seconds, cpu = timed(ctx, runner, lines)
    return {"epoch_s": round(seconds, 4)} | {f"cpu_{k}_s": v for k, v in cpu.items()}


SCENARIO = Scenario(
    name="throughput",
    about="one epoch on loopback: twophase against direct writes to InfluxDB",
    sides=SIDES,
    cases=lambda quick: {"10k": 10_000} if quick else {"100k": 100_000, "1M": 1_000_000},
    run=run,
    repeats=(2, 5),
    notes=(
        "direct: one connection, 5,000 lines a request; direct_4: the points in four "
        "parts, POSTed at once over four connections",
        "cpu_client_s is this process: for twophase, staging (the executors' share) and "
        "promotion (the driver's) together",
    ),
)
