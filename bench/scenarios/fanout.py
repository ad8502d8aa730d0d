"""Two targets against one: a sink delivering each epoch to two InfluxDB databases
(targets ``a`` and ``b``, both caught up) against a sink with one. Each epoch is staged
off the clock and timed through ``Committer.commit`` (decide, promote to every target,
mark). Both sides are twophase: the reference is the one-target sink, so a ratio below
1 is what the second target costs. Both targets are databases of the dev InfluxDB.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bench.harness.scenario import Context, Figures, Scenario, in_process, timed
from bench.harness.sides import TwoPhaseSide, epoch_lines
from twophase.config import NamedTarget, TwoPhaseConfig
from twophase.protocol.commit.runtime import TwoPhase


def make(ctx: Context) -> dict[str, Any]:
    """The sides, opened once per run of the scenario (closed by the harness)."""
    staging = ctx.scratch.staging("main")
    a, b = ctx.scratch.influx("a"), ctx.scratch.influx("b")
    two = dataclasses.replace(a, targets=(NamedTarget("a", a), NamedTarget("b", b)))
    one_tp = TwoPhase.open(TwoPhaseConfig(staging, ctx.scratch.influx("one")))
    two_tp = TwoPhase.open(TwoPhaseConfig(staging, two))
    ctx.closers += [one_tp.close, two_tp.close]
    return {
        "one_target": TwoPhaseSide(one_tp, "bench-one"),
        "two_targets": TwoPhaseSide(two_tp, "bench-two"),
    }


def run(ctx: Context, side: str, size: int) -> Figures:
    runner = in_process(ctx, make)[side]
    lines = epoch_lines(size, ctx.fresh())
    _, cpu = timed(ctx, runner, lines)
    figures = {"commit_s": round(runner.phases.commit[-1], 4)}
    return figures | {f"cpu_{k}_s": v for k, v in cpu.items()}


SCENARIO = Scenario(
    name="fanout",
    about="an epoch's commit to two InfluxDB targets against one",
    sides=("one_target", "two_targets"),
    cases=lambda quick: {"10k": 10_000} if quick else {"100k": 100_000},
    run=run,
    repeats=(2, 5),
    notes=(
        "commit_s: decide, promote to every target, mark (staging is off the clock); "
        "cpu_*: over stage and commit",
    ),
)
