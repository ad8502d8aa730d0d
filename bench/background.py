"""Metric 8: sustained throughput with background promotion.

``SIZES`` epochs in a row through the full protocol, as a sink runs them:
stage epoch N, commit it, stage N+1... With ``promotion = background`` the
commit returns once the epoch is decided, so staging N+1 overlaps promoting
N; the run ends with a drain, inside the timing. The same epochs go through
inline promotion (today's default) and straight to InfluxDB (what a user
writes instead: :class:`bench.direct.DirectWriter`, none of twophase's code),
each side into an InfluxDB database of its own. Points per second over the
whole run; the sides' order rotates per repeat; medians. Target: background
at least 1.0x direct at 100k- and 1M-point epochs; inline is reported.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from bench.context import MAIN, Context
from bench.lines import epoch_lines
from bench.report import size_label
from bench.sides import QUERY_ID, BenchError, DirectSide
from bench.stats import compared, rotated
from twophase.config import BACKGROUND, INLINE
from twophase.protocol.commit.runtime import TwoPhase

TARGET = 1.0


class Consecutive:
    """One sink's epochs, run back to back through one set of parts; ``run`` returns
    wall seconds for the whole sequence, drain included."""

    def __init__(self, tp: TwoPhase, sink_id: str) -> None:
        self.tp, self.sink_id, self.epoch = tp, sink_id, 0

    def run(self, epochs: Sequence[Sequence[str]]) -> float:
        lease = self.tp.begin_run(self.sink_id, uuid.uuid4().hex, QUERY_ID)
        first, started = self.epoch, time.perf_counter()
        for lines in epochs:
            message = self.tp.stager.stage(self.sink_id, self.epoch, lines)
            self.tp.committer.commit(lease, self.epoch, [message])
            self.epoch += 1
        self.tp.committer.drain()
        elapsed = time.perf_counter() - started
        self._check(first, sum(len(lines) for lines in epochs))
        return elapsed

    def _check(self, first: int, points: int) -> None:
        with self.tp.db.transaction() as cur:
            cur.execute(
                "SELECT count(*) FILTER (WHERE state = 'COMMITTED'), sum(points_delivered)"
                " FROM twophase_epochs WHERE sink_id = %s AND epoch >= %s",
                (self.sink_id, first),
            )
            committed, delivered = cur.fetchone() or (0, 0)
        if committed != self.epoch - first or delivered != points:
            raise BenchError(f"{self.sink_id}: {committed} epochs, {delivered}/{points} points")


def measure_background(ctx: Context) -> dict[str, Any]:
    parts: dict[str, Any] = {}
    opened = {mode: _open(ctx, mode) for mode in (INLINE, BACKGROUND)}
    try:
        sides = {mode: Consecutive(tp, f"bench-{mode}") for mode, tp in opened.items()}
        direct = DirectSide(ctx.scratch.influx("direct_consecutive"))
        _warm_up(ctx, sides, direct)
        for size, count, repeats in ctx.plan.background:
            ctx.log(f"background: {count} x {size:,}-point epochs in a row x {repeats} per side")
            parts.update(_at(ctx, size, count, repeats, sides, direct))
        direct.close()
    finally:
        for tp in opened.values():
            tp.close()
    holds = [p["holds"] for p in parts.values() if p["holds"] is not None]
    worst = min((p for p in parts.values() if p["holds"] is not None), key=lambda p: p["ratio"])
    return {**worst, "holds": all(holds), "target": f">= {TARGET}x direct", "parts": parts}


def _open(ctx: Context, mode: str) -> TwoPhase:
    config = ctx.scratch.config(MAIN, f"tp_{mode}")
    influx = dataclasses.replace(config.target, promotion=mode)
    return TwoPhase.open(dataclasses.replace(config, target=influx))


def _warm_up(ctx: Context, sides: dict[str, Consecutive], direct: DirectSide) -> None:
    lines = [epoch_lines(10_000, ctx.seeds.take())]
    for side in sides.values():
        side.run(lines)
    direct.run(lines[0])


def _at(
    ctx: Context,
    size: int,
    count: int,
    repeats: int,
    sides: dict[str, Consecutive],
    direct: DirectSide,
) -> dict[str, Any]:
    rate = rates(ctx, size, count)
    runs = {mode: rate(side.run) for mode, side in sides.items()}
    runs["direct"] = rate(direct.run_all)
    got = rotated(repeats, runs)
    return {
        f"{size_label(size)} {mode}": _entry(got[mode], got["direct"], mode, size, count)
        for mode in (BACKGROUND, INLINE)
    }


Rate = Callable[[Callable[[list[list[str]]], float]], Callable[[int], float]]


def rates(ctx: Context, size: int, count: int) -> Rate:
    """``rate(run)``: for repeat ``r``, the points/s of ``run`` over ``count`` fresh epochs
    of ``size`` points, the same epochs for every side of a repeat (one repeat's lines
    in memory at a time)."""
    made: dict[int, list[list[str]]] = {}

    def epochs(repeat: int) -> list[list[str]]:
        if repeat not in made:
            made.clear()
            made[repeat] = [epoch_lines(size, ctx.seeds.take()) for _ in range(count)]
        return made[repeat]

    return lambda run: lambda repeat: size * count / run(epochs(repeat))


def _entry(tp: list[float], dr: list[float], mode: str, size: int, count: int) -> dict[str, Any]:
    target = TARGET if mode == BACKGROUND else None
    return compared("points/s", ((mode, tp), ("direct", dr)), target, points=size, epochs=count)
