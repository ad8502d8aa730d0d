"""Words for messages about epochs and durations, shared by errors, warnings and the CLI."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone


def iso(value: datetime) -> str:
    """A moment as ISO-8601 UTC with a ``Z``: ``2026-11-22T10:00:00.123456Z``."""
    return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def age(seconds: float | None) -> str:
    """``90`` -> ``'1m30s'``; ``'-'`` for None."""
    if seconds is None:
        return "-"
    whole = int(seconds)
    for unit, span, sub, sub_span in (
        ("d", 86400, "h", 3600),
        ("h", 3600, "m", 60),
        ("m", 60, "s", 1),
    ):
        if whole >= span:
            rest = (whole % span) // sub_span
            return f"{whole // span}{unit}" + (f"{rest}{sub}" if rest else "")
    return f"{whole}s"


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def compact_ranges(numbers: Sequence[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``'0-2, 5, 7-8'`` (for naming many epochs in one line)."""
    runs: list[list[int]] = []
    for number in sorted(set(numbers)):
        if runs and number == runs[-1][1] + 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def name_epochs(numbers: Sequence[int]) -> str:
    """``'epoch 3'``, ``'epochs 0-2, 5'``, or with corrections ``'epochs 4, c1, c2'``."""
    if len(set(numbers)) == 1:
        return f"epoch {epoch_label(numbers[0])}"
    batch = [n for n in numbers if n >= 0]
    parts = [compact_ranges(batch)] if batch else []
    return "epochs " + ", ".join(parts + [f"c{n}" for n in sorted({-n for n in numbers if n < 0})])


def epochs_are(numbers: Sequence[int]) -> str:
    """``'epoch 3 is'`` or ``'epochs 0-2, 5 are'``: the subject of a message about epochs."""
    return name_epochs(numbers) + (" is" if len(set(numbers)) == 1 else " are")


def epoch_label(epoch: int) -> str:
    """An epoch as operators read it: Spark's batch id, or ``c<n>`` for the sink's
    n-th correction (epoch ``-n``,
    [`twophase.operations.requeuer`][twophase.operations.requeuer])."""
    return f"c{-epoch}" if epoch < 0 else str(epoch)
