"""Automatic GC: the process that commits a sink collects the sink's garbage by itself.

Without it nothing purges staged points past retention or orphaned writes unless an operator
runs ``twophase gc``, and the staging store grows until PostgreSQL's disk is full and every
step stalls. The committer calls [`AutoGc.poke`][twophase.protocol.maintain.autogc.AutoGc.poke] as
each commit returns; a collection of that sink starts when one is due.

Contracts:

* Never on a commit's critical path: the collection runs on a daemon thread
  of its own; ``poke`` only starts it, and never waits or raises.
* Once per ``gc_interval`` per sink (0: never), the first one an interval
  after the sink's first commit in the process, so a restarted query catches
  up before it collects; never two collections at once in a process (a sink
  falling due meanwhile waits for a later commit).
* Bounded: one collection purges at most ``limit`` expired epochs, removes
  at most ``limit`` orphaned writes and compacts at most ``limit`` epoch
  records. One that stopped at its bound left more:
  the next is due at once, at the sink's next commit, rather than an interval
  later, so a sink that ends more epochs per interval than the bound (or a
  backlog: GC turned on late, a reset) is caught up in bounded steps.
* Only the run that owns the sink collects it: ``poke`` follows a commit, which
  only the lease's holder completes. GC locks the sink rows first, as decide
  does, so a collection beside a commit never removes a chosen write (I1).
* A failed collection is a warning in the log; the next due one tries again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from twophase.logs import fields
from twophase.protocol.maintain.gc import GarbageCollector
from twophase.wording import age

log = logging.getLogger("twophase.protocol.autogc")

# Expired epochs purged, orphaned writes removed, epoch records compacted, per automatic
# collection: five transactions of GC's chunk (200) each at most, however large a backlog is.
LIMIT = 1000
CLOSE_WAIT_S = 10.0  # how long closing waits for a collection under way


class AutoGc:
    """Collects a sink's garbage on a background thread, when due, after its commits."""

    def __init__(
        self,
        gc: GarbageCollector,
        interval_s: float,
        limit: int = LIMIT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._gc = gc
        self._interval = interval_s
        self._limit = limit
        self._clock = clock
        self._lock = threading.Lock()
        self._due: dict[str, float] = {}
        self._thread: threading.Thread | None = None
        self._closed = False

    def poke(self, sink_id: str) -> bool:
        """Start collecting ``sink_id`` on a thread if it is due and no collection runs;
        whether one started. Returns at once, never raises."""
        if self._interval <= 0:
            return False
        with self._lock:
            now = self._clock()
            due = self._due.setdefault(sink_id, now + self._interval)
            if self._closed or now < due or self.running:
                return False
            self._due[sink_id] = now + self._interval
            self._thread = threading.Thread(
                target=self._collect, args=(sink_id,), name="twophase-gc", daemon=True
            )
            self._thread.start()
        return True

    @property
    def running(self) -> bool:
        """Whether a collection is under way."""
        return self._thread is not None and self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the collection under way, if any; whether none runs any more."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return not self.running

    def close(self, timeout: float = CLOSE_WAIT_S) -> None:
        """Start no more collections, and give the one under way ``timeout`` to end."""
        with self._lock:
            self._closed = True
        if not self.wait(timeout):  # a daemon thread: it ends with the process
            log.warning(
                "automatic gc still running after %s; left to end with the process",
                age(timeout),
                extra=fields(),
            )

    def _collect(self, sink_id: str) -> None:
        started = time.monotonic()
        try:
            done = self._gc.collect(sink_id, limit=self._limit)
        except Exception as exc:  # a collection must never reach a commit: logged, retried
            log.warning(
                "sink %s: automatic gc failed (next try in %s): %s",
                sink_id,
                age(self._interval),
                exc,
                extra=fields(sink_id),
            )
            return
        if max(done.epochs_purged, done.orphan_writes, done.epochs_compacted) >= self._limit:
            with self._lock:  # stopped at its bound: the next commit goes on
                self._due[sink_id] = self._clock()
        log.log(
            logging.INFO
            if done.epochs_purged or done.orphan_writes or done.epochs_compacted
            else logging.DEBUG,
            "sink %s: automatic gc purged %d epochs (%d points) and %d orphaned writes,"
            " compacted %d epoch records, in %.2fs",
            sink_id,
            done.epochs_purged,
            done.points_purged,
            done.orphan_writes,
            done.epochs_compacted,
            time.monotonic() - started,
            extra=fields(sink_id),
        )
