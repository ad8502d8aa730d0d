"""Consume an iterator in a background thread, a bounded number of items ahead.

Promotion reads staged chunks from PostgreSQL and sends them to InfluxDB; done in turn,
every read adds its whole time to the send's.
[`read_ahead`][twophase.protocol.deliver.readahead.read_ahead] runs them at once: both mostly wait
on sockets, where Python releases the GIL (the study "Read-ahead" in
``git show f5c61bb^:bench/README.md``).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

_DONE = object()


def read_ahead(items: Iterable[T], depth: int = 2) -> Generator[T, None, None]:
    """Yield ``items`` in order while a thread produces up to ``depth`` more.

    An exception raised by ``items`` is raised here, at the point it was
    reached. When the consumer stops early (an error, or ``close()``), the
    thread stops after its current item and ``items`` is closed in that
    thread, releasing what it holds (a cursor, a pooled connection).
    """
    if depth < 1:
        raise ValueError("depth must be at least 1")
    ahead: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()
    thread = threading.Thread(
        target=_produce, args=(items, ahead, stop), name="twophase-read-ahead", daemon=True
    )
    thread.start()
    try:
        while (item := ahead.get()) is not _DONE:
            if isinstance(item, _Failure):
                raise item.error
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        while thread.is_alive():  # unblock a producer waiting on a full queue
            with contextlib.suppress(queue.Empty):
                ahead.get(timeout=0.05)


@dataclass(frozen=True)
class _Failure:
    """An exception raised by the source, carried to the consumer."""

    error: BaseException


def _produce(items: Iterable[T], ahead: queue.Queue[object], stop: threading.Event) -> None:
    iterator = iter(items)
    try:
        for item in iterator:
            if stop.is_set():
                return
            ahead.put(item)
        ahead.put(_DONE)
    except BaseException as exc:  # handed to the consumer and raised there
        ahead.put(_Failure(exc))
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
