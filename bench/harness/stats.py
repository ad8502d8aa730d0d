"""Summaries over repeats, sides run in rotated order, and ratios against a reference."""

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

    def as_dict(self, digits: int = 4) -> dict[str, Any]:
        data = asdict(self)
        for key in ("median", "min", "max"):
            data[key] = round(data[key], digits)
        data["values"] = [round(v, digits) for v in self.values]
        return data


def rotated(repeats: int, sides: Sequence[str], run: Callable[[str, int], None]) -> None:
    """``run(side, repeat)`` for every side each repeat, the order rotating by one each
    repeat (A B C, B C A, C A B, ...): every side meets the same machine noise, and none
    always runs right after another (a compaction or checkpoint one side triggers would
    otherwise always land on the same other side)."""
    names = list(sides)
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            run(name, r)


def ratio(other: Sequence[float], reference: Sequence[float]) -> float | None:
    """The other side's median over the reference's: on costs (seconds, CPU seconds),
    above 1 means the reference side is cheaper."""
    if not other or not reference:
        return None
    below = statistics.median(reference)
    return round(statistics.median(other) / below, 3) if below else None
