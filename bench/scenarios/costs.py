"""What exactly-once costs, per million points, process by process: one epoch through
twophase against the user's alternatives (one connection as text; four connections,
each request gzip level 1, as a user on a slow link writes).

Figures per million points: wall seconds, twophase's stage and commit seconds apart,
CPU seconds of this process, of the staging store's backends and of influxd. Where a
ratio is below 1, twophase spends more of that figure than the other side.
"""

from __future__ import annotations

from typing import Any

from bench.harness.scenario import Context, Figures, Scenario, in_process, timed
from bench.harness.sides import DirectSide, TwoPhaseSide, epoch_lines
from twophase.protocol.commit.runtime import TwoPhase


def make(ctx: Context) -> dict[str, Any]:
    """The sides, opened once per run of the scenario (closed by the harness)."""
    tp = TwoPhase.open(ctx.scratch.config("main", "tp"))
    made: dict[str, Any] = {
        "twophase": TwoPhaseSide(tp, "bench-costs"),
        "direct": DirectSide(ctx.scratch.influx("direct")),
        "direct_gzip_4": DirectSide(ctx.scratch.influx("direct"), 4, gzip_level=1),
    }
    ctx.closers += [tp.close, made["direct"].close, made["direct_gzip_4"].close]
    return made


def run(ctx: Context, side: str, size: int) -> Figures:
    runner = in_process(ctx, make)[side]
    lines = epoch_lines(size, ctx.fresh())
    seconds, cpu = timed(ctx, runner, lines)
    per = 1_000_000 / size
    figures = {"wall_s_per_M": round(seconds * per, 4)}
    if isinstance(runner, TwoPhaseSide):
        figures["stage_s_per_M"] = round(runner.phases.stage[-1] * per, 4)
        figures["commit_s_per_M"] = round(runner.phases.commit[-1] * per, 4)
    return figures | {f"cpu_{k}_s_per_M": round(v * per, 4) for k, v in cpu.items()}


SCENARIO = Scenario(
    name="costs",
    about="CPU and wall seconds per million points, by process: twophase against direct",
    sides=("twophase", "direct", "direct_gzip_4"),
    cases=lambda quick: {"20k": 20_000} if quick else {"500k": 500_000},
    run=run,
    repeats=(2, 5),
    notes=(
        "cpu_client: this process (twophase: staging and promotion; direct: formatting "
        "and sending); cpu_postgres: the staging backends; cpu_influxd: the whole server",
    ),
)
