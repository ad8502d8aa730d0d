"""Grouping items into batches by count and size: pure logic both sides use.

Staging cuts a write's lines into chunks with it (executors), and promotion
groups staged chunks into a target's requests with it (driver). It lives apart
from the network code so that executors import nothing they do not need.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def batches(
    items: Iterable[T],
    max_points: int,
    max_bytes: int,
    size: Callable[[T], int],
    points: Callable[[T], int] = lambda _: 1,
) -> Iterator[list[T]]:
    """Group ``items`` lazily, in order, into lists whose ``points`` sum to at
    most ``max_points`` and whose ``size`` sums to at most ``max_bytes``.

    An item over either limit on its own forms a batch of one (the server
    decides whether it is too large). ``size`` should include any separator
    (one newline per line of line protocol); ``points`` counts each item as
    one point unless told otherwise (a piece of several lines).
    """
    if max_points < 1 or max_bytes < 1:
        raise ValueError("max_points and max_bytes must be positive")
    batch: list[T] = []
    count = total = 0
    for item in items:
        item_points, item_size = points(item), size(item)
        if batch and (count + item_points > max_points or total + item_size > max_bytes):
            yield batch
            batch, count, total = [], 0, 0
        batch.append(item)
        count += item_points
        total += item_size
    if batch:
        yield batch
