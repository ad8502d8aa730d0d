"""Metric 1 (throughput per epoch size) and metric 2 (fixed cost per epoch)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from bench.context import Context
from bench.lines import epoch_lines
from bench.sides import DirectSide, TwoPhaseSide
from bench.stats import Summary, entry, interleaved

THROUGHPUT_TARGET = 0.8
THROUGHPUT_FROM = 100_000  # the target applies to epochs of this size and above
FIXED_COST_TARGET_MS = 15.0
FIXED_POINTS = 10
WARMUP_POINTS = 10_000


class SharedLines:
    """The lines of repeat ``r``, built once and used by both sides, then dropped."""

    def __init__(self, ctx: Context, size: int) -> None:
        self._ctx, self._size = ctx, size
        self._repeat: int | None = None
        self._lines: list[str] = []

    def get(self, repeat: int) -> list[str]:
        if repeat != self._repeat:
            self._lines = []  # free the previous repeat's lines before building the next
            self._lines = epoch_lines(self._size, self._ctx.seeds.take())
            self._repeat = repeat
        return self._lines


def rate(run: Callable[[Sequence[str]], float], lines: SharedLines) -> Callable[[int], float]:
    def one(repeat: int) -> float:
        chunk = lines.get(repeat)
        return len(chunk) / run(chunk)

    return one


def warm_up(ctx: Context, tp_side: TwoPhaseSide, direct: DirectSide) -> None:
    """One untimed epoch per side: connections, series creation in InfluxDB, caches."""
    lines = epoch_lines(WARMUP_POINTS, ctx.seeds.take())
    tp_side.run(lines)
    direct.run(lines)


def throughput_at(
    ctx: Context, size: int, repeats: int, tp_side: TwoPhaseSide, direct: DirectSide
) -> dict[str, Any]:
    lines = SharedLines(ctx, size)
    first = len(tp_side.phases.stage)
    tp, dr = interleaved(repeats, rate(tp_side.run, lines), rate(direct.run, lines))
    ratio = statistics.median(tp) / statistics.median(dr)
    applies = size >= THROUGHPUT_FROM
    return entry(
        "points/s",
        {"twophase": Summary.of(tp), "direct": Summary.of(dr)},
        ratio,
        "twophase / direct (medians)",
        f">= {THROUGHPUT_TARGET}x direct" if applies else "none below 100k points (reported)",
        ratio >= THROUGHPUT_TARGET if applies else None,
        points=size,
        phases_s=_phases(tp_side, first),
    )


def _phases(side: TwoPhaseSide, first: int) -> dict[str, float]:
    return {
        "stage_median": round(statistics.median(side.phases.stage[first:]), 4),
        "commit_median": round(statistics.median(side.phases.commit[first:]), 4),
    }


def measure_throughput(ctx: Context) -> dict[str, Any]:
    """Metric 1: points/s per epoch size, both sides on the same lines, interleaved."""
    tp_side, direct = TwoPhaseSide(ctx.tp(), "bench-throughput"), ctx.direct()
    warm_up(ctx, tp_side, direct)
    by_size: dict[str, Any] = {}
    for size, repeats in ctx.plan.throughput:
        ctx.log(f"throughput: {size:,}-point epochs x {repeats} per side")
        by_size[str(size)] = throughput_at(ctx, size, repeats, tp_side, direct)
    return headline(by_size)


def headline(by_size: dict[str, Any]) -> dict[str, Any]:
    """The metric's entry: the worst size the target applies to, with every size below it."""
    applicable = [e for e in by_size.values() if e["holds"] is not None]
    if not applicable:
        return {**next(iter(by_size.values())), "by_size": by_size}
    worst = min(applicable, key=lambda e: e["ratio"])
    holds = all(e["holds"] for e in applicable)
    return {
        **worst,
        "holds": holds,
        "target": f">= {THROUGHPUT_TARGET}x direct at >= 100k points",
        "by_size": by_size,
    }


def measure_fixed_cost(ctx: Context) -> dict[str, Any]:
    """Metric 2: milliseconds per 10-point epoch: the protocol's own transactions."""
    n = ctx.plan.fixed_epochs
    ctx.log(f"fixed cost: {n} {FIXED_POINTS}-point epochs per side")
    tp_side, direct = TwoPhaseSide(ctx.tp(), "bench-fixed"), ctx.direct()
    return fixed_cost(ctx, n, tp_side, direct)


def fixed_cost(ctx: Context, n: int, tp_side: TwoPhaseSide, direct: DirectSide) -> dict[str, Any]:
    lines = SharedLines(ctx, FIXED_POINTS)
    tp, dr = interleaved(n, _millis(tp_side.run, lines), _millis(direct.run, lines))
    over = statistics.median(tp) - statistics.median(dr)
    return entry(
        "ms per epoch",
        {"twophase": Summary.of(tp), "direct": Summary.of(dr)},
        statistics.median(tp) / statistics.median(dr),
        "twophase / direct (medians)",
        f"<= {FIXED_COST_TARGET_MS:g} ms over direct (median)",
        over <= FIXED_COST_TARGET_MS,
        overhead_ms=round(over, 3),
        points=FIXED_POINTS,
        phases_ms={k: round(v * 1000, 3) for k, v in _phases(tp_side, 0).items()},
    )


def _millis(run: Callable[[Sequence[str]], float], lines: SharedLines) -> Callable[[int], float]:
    def one(repeat: int) -> float:
        return run(lines.get(repeat)) * 1000

    return one
