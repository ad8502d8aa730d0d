"""Summaries over repeats, A/B interleaving, and the shape of one metric entry."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Summary:
    """Median, min and max of one side's repeats (and the raw values, for the record)."""

    median: float
    min: float
    max: float
    n: int
    values: tuple[float, ...]

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        if not values:
            raise ValueError("no values to summarise")
        return cls(statistics.median(values), min(values), max(values), len(values), tuple(values))

    def as_dict(self, digits: int = 3) -> dict[str, Any]:
        data = asdict(self)
        for key in ("median", "min", "max"):
            data[key] = round(data[key], digits)
        data["values"] = [round(v, digits) for v in self.values]
        return data


def interleaved(
    repeats: int, a: Callable[[int], float], b: Callable[[int], float]
) -> tuple[list[float], list[float]]:
    """Run ``a(r)`` and ``b(r)`` for each repeat ``r``, alternating which goes first.

    A B, B A, A B, ...: both sides meet the same machine noise, and neither
    always runs right after the other (InfluxDB compactions and PostgreSQL
    checkpoints triggered by one side would otherwise always hit the other).
    """
    out_a: list[float] = []
    out_b: list[float] = []
    for r in range(repeats):
        first, second = ((a, out_a), (b, out_b)) if r % 2 == 0 else ((b, out_b), (a, out_a))
        first[1].append(first[0](r))
        second[1].append(second[0](r))
    return out_a, out_b


def rotated(repeats: int, runs: dict[str, Callable[[int], float]]) -> dict[str, list[float]]:
    """Each repeat runs every side once; the order rotates by one each repeat (A B C, B C A...)."""
    names = list(runs)
    out: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            out[name].append(runs[name](r))
    return out


def entry(
    unit: str,
    sides: dict[str, Summary],
    ratio: float,
    ratio_of: str,
    target: str,
    holds: bool | None,
    **extra: Any,
) -> dict[str, Any]:
    """One metric: both sides' summaries, the ratio (and what it divides), target, verdict."""
    return {
        "unit": unit,
        "sides": {name: s.as_dict() for name, s in sides.items()},
        "ratio": round(ratio, 3),
        "ratio_of": ratio_of,
        "target": target,
        "holds": holds,
        **extra,
    }


def compared(
    unit: str,
    sides: tuple[tuple[str, Sequence[float]], tuple[str, Sequence[float]]],
    target: float | None,
    **extra: Any,
) -> dict[str, Any]:
    """An entry of side A against side B (``((name, values), (name, values))``): A's median
    over B's, held to at least ``target`` times B's (None: reported only)."""
    (side, a), (other, b) = sides
    ratio = statistics.median(a) / statistics.median(b)
    return entry(
        unit,
        {side: Summary.of(a), other: Summary.of(b)},
        ratio,
        f"{side} / {other} (medians)",
        f">= {target}x {other}" if target else "none (reported)",
        ratio >= target if target else None,
        **extra,
    )


def at_least_direct(
    unit: str, tp: Sequence[float], dr: Sequence[float], target: float, **extra: Any
) -> dict[str, Any]:
    """An entry whose target is twophase's median at least ``target`` times direct's."""
    ratio = statistics.median(tp) / statistics.median(dr)
    return entry(
        unit,
        {"twophase": Summary.of(tp), "direct": Summary.of(dr)},
        ratio,
        "twophase / direct (medians)",
        f">= {target}x direct",
        ratio >= target,
        **extra,
    )


def skipped(reason: str, **extra: Any) -> dict[str, Any]:
    """An entry for a metric that could not run (the reason says why)."""
    return {"skipped": reason, "holds": None, **extra}
