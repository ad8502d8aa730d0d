"""Lanes: an epoch promoted over several connections to a target at once, series by series.

With ``promote_connections = N`` a line's *lane* (0..N-1) is chosen when it is staged
([`LaneChooser`][twophase.protocol.stage.lanes.LaneChooser]), from a stable hash of its
measurement and tag set, and stored with its chunk; promotion sends each lane over its own
connection ([`fan_out`][twophase.protocol.stage.lanes.fan_out]) and never parses a line. Every
point of a series takes the same lane, and a lane keeps the epoch's fixed order, so two
writes of one point key within an epoch always land in the same order (I4), however many
lanes there are and however often the epoch is promoted.

The hash is CRC-32 of the measurement and the sorted tags as written (the
order of the tags in a line does not name another series), so every process
and every Python version chooses the same lane.
"""

from __future__ import annotations

import queue
import re
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar, cast

from twophase.bounded import SizedCache

T = TypeVar("T")
_UNESCAPED_SPACE = re.compile(r"(?<!\\) ")
_UNESCAPED_COMMA = re.compile(r"(?<!\\),")
# Lanes remembered by series text, counted in bytes (twophase.bounded): 16 MiB, about
# 100,000 series of 50 characters. A series over 1 KiB is hashed each time it comes:
# large unique series would fill the cache and never hit.
SERIES_CACHE_BYTES = 16 * 1024 * 1024
SERIES_ENTRY_BYTES = 1024
_QUEUED = 8  # items waiting per lane: bounds memory when one lane is slower
_POLL_S = 0.1  # how often a blocked hand-over looks whether a lane failed


class LaneChooser:
    """Chooses the lane of each staged line (one per task: keeps a cache of series)."""

    def __init__(self, lanes: int) -> None:
        if lanes < 1:
            raise ValueError("lanes must be at least 1")
        self.lanes = lanes
        self._cache: SizedCache[str, int] = SizedCache(SERIES_CACHE_BYTES, SERIES_ENTRY_BYTES)
        self._known = self._cache.entries  # read as a plain dict: a hit is one lookup

    def lane(self, line: str) -> int:
        series = _series(line)
        lane = self._known.get(series)
        if lane is None:
            lane = self._cache.put(series, _hash(series) % self.lanes, len(series))
        return lane

    def split(self, lines: list[str]) -> list[list[str]]:
        """``lines`` by lane, each lane's in their given order."""
        if self.lanes == 1:
            return [lines]
        parts: list[list[str]] = [[] for _ in range(self.lanes)]
        for line in lines:
            parts[self.lane(line)].append(line)
        return parts


def _series(line: str) -> str:
    """The measurement and tag set of a line, as written: up to the first unescaped space."""
    end = line.find(" ")
    if end < 0:
        return line
    if "\\" in line[:end]:
        match = _UNESCAPED_SPACE.search(line)
        return line[: match.start()] if match else line
    return line[:end]


def _hash(series: str) -> int:
    parts = _UNESCAPED_COMMA.split(series) if "\\" in series else series.split(",")
    canonical = "\n".join([parts[0], *sorted(parts[1:])])
    return zlib.crc32(canonical.encode("utf-8", "surrogatepass"))


_CLOSED = object()  # the end of a lane's items


def fan_out(
    items: Iterable[T],
    lane_of: Callable[[T], int],
    lanes: int,
    send: Callable[[int, Iterator[T]], None],
) -> None:
    """Give each item to its lane; ``send(lane, items)`` runs on a thread per lane.

    Items keep their order within a lane. A bounded queue per lane holds the
    items not yet taken, so a slow lane holds back the reading, not memory.
    When a lane fails the others stop before their next item, and the first
    failure is raised once every lane has ended.
    """
    stop = threading.Event()
    queues: list[queue.Queue[object]] = [queue.Queue(_QUEUED) for _ in range(lanes)]

    def run(lane: int) -> None:
        try:
            send(lane, _taken(queues[lane], stop))
        except BaseException:
            stop.set()
            raise

    with ThreadPoolExecutor(lanes, thread_name_prefix="twophase-lane") as pool:
        futures = [pool.submit(run, lane) for lane in range(lanes)]
        try:
            for item in items:
                if not _put(queues[lane_of(item)], item, stop):
                    break
        except BaseException:
            stop.set()
            raise
        finally:
            for lane_queue in queues:
                _put(lane_queue, _CLOSED, stop)
        errors = [f.exception() for f in futures]
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first


def _put(lane_queue: queue.Queue[object], item: object, stop: threading.Event) -> bool:
    """Queue ``item``; False (not queued) once any lane has failed."""
    while not stop.is_set():
        try:
            lane_queue.put(item, timeout=_POLL_S)
            return True
        except queue.Full:
            continue
    return False


def _taken(lane_queue: queue.Queue[object], stop: threading.Event) -> Iterator[T]:
    """A lane's items until the end, or until any lane failed."""
    while not stop.is_set():
        try:
            item = lane_queue.get(timeout=_POLL_S)
        except queue.Empty:
            continue
        if item is _CLOSED:
            return
        yield cast(T, item)
