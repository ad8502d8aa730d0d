"""Broadcast: one read, every consumer gets every item in order; bounded; a consumer
that stops is dropped and one that lags is left behind, and the others go on; an error
of the read reaches each consumer."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator

import pytest

from twophase.protocol.deliver.broadcast import Bounds, Broadcast, BroadcastClosed

PATIENT = 60.0  # nobody is left behind within a test


def counted(n: int, reads: list[int]) -> Iterator[int]:
    for i in range(n):
        reads.append(i)
        yield i


def broadcast(
    items: Iterable[int],
    names: Iterable[str],
    depth: int = 2,
    max_bytes: int = 10**9,
    patience_s: float = PATIENT,
    again: list[int] | None = None,
) -> Broadcast[int]:
    """A broadcast of ``items``; a consumer left behind reads ``again`` (counted: one
    entry a read, of what it read)."""
    copy = list(items) if again is not None else []

    def reread() -> Iterator[int]:
        assert again is not None
        again.append(0)
        for item in copy:
            again[-1] += 1
            yield item

    source: Iterable[int] = copy if again is not None else items
    return Broadcast(
        source, list(names), Bounds(depth, max_bytes, patience_s), size=lambda _: 1, again=reread
    )


def collect(shared: Broadcast[int], name: str, out: dict[str, list[int]]) -> threading.Thread:
    def run() -> None:
        taken = shared.take(name)
        assert taken is not None
        out[name] = list(taken)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_every_consumer_gets_every_item_in_order_from_one_read() -> None:
    reads: list[int] = []
    shared = broadcast(counted(500, reads), "abc", depth=3)
    out: dict[str, list[int]] = {}
    for thread in [collect(shared, name, out) for name in "abc"]:
        thread.join(10)
    shared.close()
    assert reads == list(range(500))  # each item read once
    assert out == {name: list(range(500)) for name in "abc"}


def test_a_consumer_takes_once_and_others_are_not_takers() -> None:
    shared = broadcast([1, 2], "a")
    taken = shared.take("a")
    assert taken is not None
    assert shared.take("a") is None  # a repeat reads on its own
    assert shared.take("z") is None
    assert list(taken) == [1, 2]
    shared.close()


@pytest.mark.parametrize(("depth", "max_bytes"), [(4, 10**9), (100, 3)])
def test_the_read_stays_within_the_bound_past_the_slowest_consumer(
    depth: int, max_bytes: int
) -> None:
    reads: list[int] = []
    shared = broadcast(counted(50, reads), ["fast", "slow"], depth, max_bytes)
    out: dict[str, list[int]] = {}
    fast = collect(shared, "fast", out)
    slow = shared.take("slow")
    assert slow is not None
    assert next(slow) == 0
    time.sleep(0.3)
    assert len(reads) <= 1 + min(depth, max_bytes) + 1  # the one taken, the buffer, one in hand
    assert fast.is_alive()  # held back by the slow one, within the bound
    assert list(slow) == list(range(1, 50))
    fast.join(10)
    shared.close()
    assert out["fast"] == list(range(50))


def test_a_slow_consumer_is_left_behind_and_reads_again_from_where_it_was() -> None:
    again: list[int] = []
    shared = broadcast(range(100), ["fast", "slow"], depth=4, patience_s=0.2, again=again)
    slow = shared.take("slow")
    assert slow is not None
    assert [next(slow), next(slow)] == [0, 1]
    out: dict[str, list[int]] = {}
    clock = time.monotonic()
    collect(shared, "fast", out).join(10)
    assert time.monotonic() - clock < 5  # held back a moment, not until slow goes on
    assert out["fast"] == list(range(100))
    assert list(slow) == list(range(2, 100))  # its own read, the two it took skipped
    assert again == [100]
    shared.close()


def test_a_consumer_that_stops_is_dropped_and_the_others_go_on() -> None:
    reads: list[int] = []
    shared = broadcast(counted(200, reads), "ab")
    b = shared.take("b")
    assert b is not None
    assert next(b) == 0
    b.close()  # b failed: it takes nothing more
    out: dict[str, list[int]] = {}
    collect(shared, "a", out).join(10)
    shared.close()
    assert out["a"] == list(range(200))
    assert reads == list(range(200))


def test_a_consumer_that_never_takes_is_dropped_by_name() -> None:
    shared = broadcast(range(100), "ab")
    out: dict[str, list[int]] = {}
    a = collect(shared, "a", out)
    shared.drop("b")
    a.join(10)
    shared.close()
    assert out["a"] == list(range(100))


def test_an_error_of_the_source_reaches_every_consumer_after_the_items_before_it() -> None:
    def failing() -> Iterator[int]:
        yield 1
        yield 2
        raise OSError("connection lost")

    shared = broadcast(failing(), "ab", depth=1)
    got: dict[str, list[int]] = {"a": [], "b": []}
    errors: dict[str, BaseException] = {}

    def run(name: str) -> None:
        taken = shared.take(name)
        assert taken is not None
        try:
            for item in taken:
                got[name].append(item)
        except OSError as exc:
            errors[name] = exc

    threads = [threading.Thread(target=run, args=(n,)) for n in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    shared.close()
    assert got == {"a": [1, 2], "b": [1, 2]}
    assert set(errors) == {"a", "b"}


def test_closing_stops_the_read_and_closes_the_source() -> None:
    closed = threading.Event()

    def endless() -> Iterator[int]:
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            closed.set()

    shared = broadcast(endless(), "a")
    taken = shared.take("a")
    assert taken is not None
    assert next(taken) == 0
    shared.close()
    assert closed.is_set()
    with pytest.raises(BroadcastClosed):  # not the whole read: never taken for it
        next(taken)


def test_bounds_need_room_for_an_item() -> None:
    with pytest.raises(ValueError, match="depth"):
        Bounds(0, 10, 1.0)
