"""read_ahead: order kept, errors surface where reached, early stop releases the source."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import pytest

from twophase.protocol.deliver.readahead import read_ahead


def test_items_come_in_order() -> None:
    assert list(read_ahead(range(1000), depth=3)) == list(range(1000))
    assert list(read_ahead([], depth=1)) == []


def test_an_error_is_raised_after_the_items_before_it() -> None:
    def failing() -> Iterator[int]:
        yield 1
        yield 2
        raise OSError("connection lost")

    got = []
    with pytest.raises(OSError, match="connection lost"):
        for item in read_ahead(failing()):
            got.append(item)
    assert got == [1, 2]


def test_the_producer_stays_at_most_depth_items_ahead() -> None:
    produced = []

    def counting() -> Iterator[int]:
        for i in range(100):
            produced.append(i)
            yield i

    items = read_ahead(counting(), depth=2)
    assert next(items) == 0
    time.sleep(0.3)  # let the producer run as far as it can
    assert len(produced) <= 1 + 2 + 1  # taken, queued, and one blocked in put()
    items.close()


def test_stopping_early_closes_the_source_in_its_thread() -> None:
    released = threading.Event()

    def holding() -> Iterator[int]:
        try:
            yield from range(10_000)
        finally:
            released.set()  # a cursor and a pooled connection would be returned here

    with contextlib.closing(read_ahead(holding(), depth=2)) as items:
        for item in items:
            if item == 5:
                break
    assert released.wait(5)


def test_depth_must_be_positive() -> None:
    with pytest.raises(ValueError, match="depth"):
        next(read_ahead([1], depth=0))
