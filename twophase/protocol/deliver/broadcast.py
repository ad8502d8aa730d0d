"""One read, taken by several consumers: an epoch's chunks for every target due at once.

When a commit round sends an epoch to several caught-up targets, each of
them would read and check the same staged chunks from PostgreSQL.
[`Broadcast`][twophase.protocol.deliver.broadcast.Broadcast] reads them once, in a
thread of its own, into a buffer every target takes from in order, each at
its own pace, each with its own lanes and its own sender.

The buffer is bounded, in items and in bytes, counted from the slowest
consumer still taking. A slow consumer holds the others back only that far,
and only for a moment: once a consumer that took everything buffered has
waited ``patience_s`` for the next item, the slowest one is *left behind*,
and reads again on its own from where it was (the items it took skipped).
A consumer that stops taking (it failed, its round ended, it gave up) is
dropped at once, so the others go on without it; a target's next round
reads on its own (re-sending is harmless, I4).

Idempotent: nothing here changes state; each read, shared or on its own,
yields the same items in the same order, and a read may be broadcast again.
Thread-safe: each consumer takes on its own thread; ``take``, ``drop`` and
``close`` may be called from any.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable, Collection, Generator, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Bounds", "Broadcast", "BroadcastClosed"]

T = TypeVar("T")


class BroadcastClosed(Exception):
    """The broadcast was closed while a consumer was still taking: what it took is not
    the whole read, and must not pass for it."""


@dataclass(frozen=True)
class Bounds:
    """The buffer past the slowest consumer: at most ``depth`` items and about
    ``max_bytes`` (one item always fits); a consumer that took them all waits
    ``patience_s`` for the next before the slowest is left behind."""

    depth: int
    max_bytes: int
    patience_s: float

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise ValueError("depth must be at least 1")


@dataclass(frozen=True)
class _End:
    """The source ended: exhausted (``error`` None) or raising ``error``."""

    error: BaseException | None


class Broadcast(Generic[T]):
    """``items`` read once, for the consumers named in ``takers``.

    Each named consumer [`take`][twophase.protocol.deliver.broadcast.Broadcast.take]s
    them once, all of them in order; an exception of the source is raised to
    every consumer where it was reached. The read starts with the first
    ``take`` and keeps within ``bounds`` (``size`` of an item, for its bytes).
    A consumer left behind takes the rest of ``again()``, a read of the same
    items of its own. A consumer counts as taking until it ends or is dropped:
    one that will not take must be [`drop`][twophase.protocol.deliver.broadcast.Broadcast.drop]ped.
    """

    def __init__(
        self,
        items: Iterable[T],
        takers: Collection[str],
        bounds: Bounds,
        *,
        size: Callable[[T], int],
        again: Callable[[], Iterable[T]],
    ) -> None:
        self._source, self._again = items, again
        self._bounds, self._size = bounds, size
        self._changed = threading.Condition()
        self._items: deque[tuple[T, int]] = deque()  # (item, size), not taken by all yet
        self._base = 0  # the number of the buffer's first item
        self._bytes = 0
        self._at = dict.fromkeys(takers, 0)  # consumers still taking: their next item
        self._behind: dict[str, int] = {}  # consumers left behind: their next item
        self._taken: set[str] = set()
        self._end: _End | None = None
        self._thread: threading.Thread | None = None

    def take(self, name: str) -> Generator[T, None, None] | None:
        """The items for ``name``, once: None when it took them already, was dropped,
        or is not one of the takers (it reads on its own)."""
        with self._changed:
            if name in self._taken or name not in self._at:
                return None
            self._taken.add(name)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._read, name="twophase-broadcast", daemon=True
                )
                self._thread.start()
        return self._taking(name)

    def drop(self, name: str) -> None:
        """``name`` takes nothing more: the others no longer wait for it."""
        with self._changed:
            self._behind.pop(name, None)
            if self._at.pop(name, None) is not None:
                self._trim()

    def close(self) -> None:
        """Drop every consumer and wait for the read to stop (its source closed); one
        still taking the shared read gets BroadcastClosed."""
        with self._changed:
            self._at.clear()
            self._trim()
        if self._thread is not None:
            self._thread.join()

    def _taking(self, name: str) -> Generator[T, None, None]:
        try:
            while True:
                with self._changed:
                    self._changed.wait_for(lambda: self._ready(name))
                    if name in self._behind:
                        left_at = self._behind.pop(name)
                        break
                    got = self._next(name)
                    if got is None:
                        return  # the source is exhausted
                yield got[0]
            yield from _rest(self._again(), left_at)
        finally:
            self.drop(name)

    def _next(self, name: str) -> tuple[T] | None:
        """The next item buffered for ``name`` (None: the source is exhausted); the
        source's error; BroadcastClosed once closed. Called holding the lock."""
        if name not in self._at:
            raise BroadcastClosed("the shared read was closed before its end")
        number = self._at[name] - self._base
        if number < len(self._items):
            item = self._items[number][0]
            self._at[name] += 1
            self._trim()
            return (item,)
        if self._end is not None and self._end.error is not None:
            raise self._end.error
        return None

    def _ready(self, name: str) -> bool:
        """An item for ``name`` is buffered, or the source ended, or it was dropped or
        left behind."""
        at = self._at.get(name)
        return at is None or at < self._base + len(self._items) or self._end is not None

    def _trim(self) -> None:
        """Forget the items every consumer took (all, once none is left); wake the others.
        Called holding the lock."""
        first = min(self._at.values(), default=self._base + len(self._items))
        while self._base < first:
            _, size = self._items.popleft()
            self._bytes -= size
            self._base += 1
        self._changed.notify_all()

    def _room(self) -> bool:
        """Room for one more item, or no consumer left to read for."""
        full = len(self._items) >= self._bounds.depth or (
            self._items and self._bytes >= self._bounds.max_bytes
        )
        return not self._at or not full

    def _starved(self) -> bool:
        """A consumer took every item buffered and waits for the next."""
        head = self._base + len(self._items)
        return any(at == head and name in self._taken for name, at in self._at.items())

    def _leave_behind(self) -> None:
        """The slowest consumers read on their own from where they are."""
        slowest = min(self._at.values())
        for name in [n for n, at in self._at.items() if at == slowest]:
            self._behind[name] = self._at.pop(name)
        self._trim()

    def _read(self) -> None:
        iterator = iter(self._source)
        end = _End(None)
        try:
            for item in iterator:
                if not self._put(item):
                    return
        except BaseException as exc:  # handed to every consumer, raised there
            end = _End(exc)
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()  # the cursor and its pooled connection, released in this thread
            with self._changed:
                self._end = end
                self._changed.notify_all()

    def _put(self, item: T) -> bool:
        """Buffer ``item`` once there is room, leaving the slowest behind when another
        consumer waited too long; False when no consumer is left."""
        size = self._size(item)
        with self._changed:
            while not self._changed.wait_for(self._room, self._bounds.patience_s):
                if self._starved():
                    self._leave_behind()
            if not self._at:
                return False
            self._items.append((item, size))
            self._bytes += size
            self._changed.notify_all()
            return True


def _rest(items: Iterable[T], skip: int) -> Generator[T, None, None]:
    """``items`` past the first ``skip``; their source closed when done or left (a
    read's cursor released at once)."""
    iterator = iter(items)
    try:
        yield from itertools.islice(iterator, skip, None)
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
