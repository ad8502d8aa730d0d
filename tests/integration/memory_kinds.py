"""Two in-process kinds of target, one of each resend semantics, for the stateful test:
``memow://NAME`` overwrites (as InfluxDB does) and ``memtx://NAME`` takes an epoch in
one transaction with a record of its own (as the PostgreSQL kind does).

A store lives in this process (``STORES``, by name), so that it outlives the
``TwoPhase`` instances a test opens and abandons, and it records every request and
every committed epoch: a second delivery is visible. A test can take a store down
(``down``), slow it (``slow_s``) or make it refuse the points whose field ``v`` is a
string (``strict``, the default: as a float column or field refuses them).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from twophase.errors import BadPointsError, TransactionLostError, TransientWriteError
from twophase.points.lineproto import parse_line
from twophase.targets import OVERWRITE, TRANSACTION, TargetKind, kinds

Key = tuple[str, tuple[tuple[str, str], ...], int]  # measurement, tags, time


@dataclass
class Store:
    """What one in-process target holds, and every request it was sent."""

    name: str
    points: dict[Key, dict[str, Any]] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)  # every body it took
    # (sink, target, generation, epoch) -> counts, and every commit (+ again)
    records: dict[tuple[str, str, int, int], tuple[int, int]] = field(default_factory=dict)
    commits: list[tuple[str, str, int, int, bool]] = field(default_factory=list)
    down: bool = False
    slow_s: float = 0.0
    strict: bool = True
    lock: threading.Lock = field(default_factory=threading.Lock)

    def check(self) -> None:
        if self.slow_s:
            time.sleep(self.slow_s)
        if self.down:
            raise TransientWriteError(f"store {self.name} is down")

    def parse(self, body: bytes, gzipped: bool) -> list[tuple[Key, dict[str, Any]]]:
        """The body's points; BadPointsError naming the first refused line (nothing of
        the body taken, as InfluxDB 3 refuses a body)."""
        if gzipped:
            import gzip

            body = gzip.decompress(body)
        parsed = []
        for index, line in enumerate(body.decode().splitlines()):
            if not line.strip():
                continue
            point = parse_line(line)
            if self.strict and any(isinstance(v, str) for v in point.fields.values()):
                raise BadPointsError(
                    f"store {self.name} refused line {index}", "field v is a float", line=index
                )
            assert point.time_ns is not None
            parsed.append(((point.measurement, tuple(point.tags), point.time_ns), point.fields))
        return parsed

    def apply(self, points: Iterable[tuple[Key, dict[str, Any]]]) -> None:
        for key, fields in points:
            self.points.setdefault(key, {}).update(fields)

    def held(self, measurement: str) -> dict[str, Any]:
        """Tag ``k`` -> field ``v`` of the measurement's points."""
        with self.lock:
            return {
                dict(tags)["k"]: fields["v"]
                for (m, tags, _), fields in self.points.items()
                if m == measurement
            }


STORES: dict[str, Store] = {}


def store_of(url: str) -> Store:
    return STORES.setdefault(urlsplit(url).netloc, Store(urlsplit(url).netloc))


class OverwritingWriter:
    def __init__(self, config: Any) -> None:
        self.store = store_of(config.url)

    def write(self, body: bytes, gzipped: bool = False) -> None:
        self.store.check()
        points = self.store.parse(body, gzipped)
        with self.store.lock:
            self.store.requests.append(body.decode(errors="replace") if not gzipped else "gz")
            self.store.apply(points)

    def close(self) -> None:
        """Nothing held."""


class TransactionalWriter:
    """An EpochWriter: an epoch's bodies applied together at ``commit`` with its record,
    keyed (sink, target, generation, epoch) as the kind's contract describes."""

    def __init__(self, config: Any) -> None:
        self.store = store_of(config.url)
        self._open: tuple[str, str, int, int, bool] | None = None
        self._pending: list[tuple[Key, dict[str, Any]]] = []

    def begin(
        self, sink_id: str, epoch: int, target: str, again: bool = False, *, generation: int = 0
    ) -> tuple[int, int] | None:
        self.store.check()
        with self.store.lock:
            found = self.store.records.get((sink_id, target, generation, epoch))
        if found is not None and not again:
            return found
        self._open, self._pending = (sink_id, target, generation, epoch, again), []
        return None

    def write(self, body: bytes, gzipped: bool = False) -> None:
        if self.store.down:
            self._open = None
            raise TransactionLostError(f"store {self.store.name} went down")
        points = self.store.parse(body, gzipped)
        if self._open is None:  # outside a transaction: a body on its own
            with self.store.lock:
                self.store.apply(points)
            return
        with self.store.lock:
            self.store.requests.append(body.decode(errors="replace") if not gzipped else "gz")
        self._pending += points

    def commit(self, delivered: int, rejected: int) -> None:
        if self._open is None or self.store.down:
            self._open = None
            raise TransactionLostError(f"store {self.store.name}: no transaction")
        sink_id, target, generation, epoch, again = self._open
        with self.store.lock:
            self.store.apply(self._pending)
            self.store.records[(sink_id, target, generation, epoch)] = (delivered, rejected)
            self.store.commits.append((sink_id, target, generation, epoch, again))
        self._open, self._pending = None, []

    def rollback(self) -> None:
        self._open, self._pending = None, []

    def close(self) -> None:
        self.rollback()


class MemoryReadback:
    def __init__(self, config: Any) -> None:
        self.store = store_of(config.url)

    def window(self, measurement: str, start: int, end: int) -> list[dict[str, Any]]:
        with self.store.lock:
            found = [
                (tags, t, fields)
                for (m, tags, t), fields in self.store.points.items()
                if m == measurement and start <= t <= end
            ]
        return [
            {
                "name": measurement,
                "tags": dict(tags),
                "columns": ["time", *fields],
                "values": [[t, *fields.values()]],
            }
            for tags, t, fields in found
        ]

    def probe(self) -> None:
        self.store.check()

    def close(self) -> None:
        """Nothing held."""


OVERWRITING = TargetKind("memow", ("memow",), OVERWRITE, OverwritingWriter, MemoryReadback)
TRANSACTIONAL = TargetKind("memtx", ("memtx",), TRANSACTION, TransactionalWriter, MemoryReadback)


@contextlib.contextmanager
def registered() -> Iterator[None]:
    """The two kinds known to the registry while the block runs."""
    kinds.cache_clear()
    found = kinds()
    found[OVERWRITING.name], found[TRANSACTIONAL.name] = OVERWRITING, TRANSACTIONAL
    try:
        yield
    finally:
        kinds.cache_clear()
        STORES.clear()
