"""The catch-up worker: delivers a lagging target's backlog from staging, oldest first.

A target a commit left without its epoch ([`twophase.protocol.fanout`][twophase.protocol.fanout]) is
owed every COMMITTED epoch past its cursor. The worker delivers them to it one
at a time, in epoch order, each with the whole ``influx_retry_deadline``, and
records each (``TargetLedger.delivered``) before it takes the next, so the
target's delivered epochs stay a prefix of the COMMITTED ones (I9) and a
crash anywhere leaves the cursor on the last epoch recorded: the next worker
sends the following one (again, if its delivery was not recorded: I4).

One delivery of a target at a time, across processes: the epoch is chosen and
sent under the target's advisory lock (``Database.session_lock``), so two
workers (a driver's and ``twophase recover``) never interleave requests of two
epochs. A promotion sends epoch N to a target only when its cursor already
holds every COMMITTED epoch below N, and the worker sends only COMMITTED
epochs, so the two never send one target different epochs at once either.

In a driver the worker runs on a daemon thread per sink from the run's claim
until the process closes it, looking for a backlog every ``poll_s`` and at
once when a commit leaves a target behind (a target whose delivery failed is
tried again after a pause doubling with each failure, up to a minute); it
checks the run's lease before every request, and ends for good when the run
is fenced. Quarantined targets are left to ``twophase targets resync``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from twophase.errors import TARGET_FAILURES, FencedError, TwoPhaseError
from twophase.logs import lease_fields
from twophase.model import Lease
from twophase.protocol.promoter import Promoter
from twophase.protocol.reader import StagedReader
from twophase.protocol.targets import TargetLedger
from twophase.store.database import Database

__all__ = ["CatchUp", "TargetPromoters"]

log = logging.getLogger("twophase.protocol.catchup")
_POLL_S = 2.0  # how often a driver's worker looks for a backlog when not told of one
_CLOSE_WAIT_S = 10.0
_MAX_PAUSE_S = 60.0  # the longest wait before trying a failing target again


@dataclass(frozen=True)
class TargetPromoters:
    """One target's promoters: ``commit`` gives up on a failing server after
    ``target_deadline`` (a commit's round), ``catch_up`` after ``influx_retry_deadline``."""

    name: str
    commit: Promoter
    catch_up: Promoter


class _Stopped(TwoPhaseError):
    """The worker was closed: it starts no request more."""


class CatchUp:
    """Delivers lagging targets' backlogs, in epoch order, one epoch at a time."""

    def __init__(
        self,
        db: Database,
        reader: StagedReader,
        targets: TargetLedger,
        promoters: Sequence[TargetPromoters],
        poll_s: float = _POLL_S,
    ) -> None:
        self._db = db
        self._reader = reader
        self._targets = targets
        self._promoters = tuple(promoters)
        self._poll_s = poll_s
        self._lock = threading.Lock()
        self._threads: dict[str, threading.Thread] = {}
        self._leases: dict[str, Lease] = {}
        # by (sink, target), each touched by that sink's thread only
        self._failures: dict[tuple[str, str], int] = {}
        self._not_before: dict[tuple[str, str], float] = {}
        self._woken: dict[str, threading.Event] = {}
        self._stop = threading.Event()

    def poke(self, lease: Lease) -> None:
        """Look for the sink's backlog now, on its thread (started on first use), under
        ``lease`` (the latest run's lease of the sink in this process)."""
        with self._lock:
            if self._stop.is_set():
                return
            self._leases[lease.sink_id] = lease
            woken = self._woken.setdefault(lease.sink_id, threading.Event())
            woken.set()
            thread = self._threads.get(lease.sink_id)
            if thread is None or not thread.is_alive():
                thread = threading.Thread(
                    target=self._watch,
                    args=(lease.sink_id, woken),
                    name=f"twophase-catch-up-{lease.sink_id}",
                    daemon=True,
                )
                self._threads[lease.sink_id] = thread
                thread.start()

    def run(self, lease: Lease, names: Sequence[str] | None = None) -> list[tuple[str, int]]:
        """Deliver every backlog (of the targets ``names``) now, on this thread; (target,
        epoch) of each epoch delivered. Raises the first failure."""
        done: list[tuple[str, int]] = []
        for target in self._promoters:
            if names is None or target.name in names:
                done += self._catch_up(lease, target, quarantined=names is not None)
        return done

    def close(self) -> None:
        """Stop the threads before their next request; wait for them a bounded time."""
        with self._lock:
            self._stop.set()
            threads = list(self._threads.values())
            for woken in self._woken.values():
                woken.set()
        for thread in threads:
            thread.join(_CLOSE_WAIT_S)

    def _watch(self, sink_id: str, woken: threading.Event) -> None:
        while not self._stop.is_set():
            woken.clear()
            lease = self._leases[sink_id]
            try:
                for target in self._promoters:
                    self._try(lease, target)
            except FencedError as exc:
                with self._lock:
                    if self._leases[sink_id] == lease:  # no newer run of ours to go on with
                        log.info(
                            "sink %s: catch-up ends, fenced: %s",
                            sink_id,
                            exc,
                            extra=lease_fields(lease),
                        )
                        del self._threads[sink_id]
                        return
                continue
            except _Stopped:
                return
            woken.wait(self._poll_s)

    def _try(self, lease: Lease, target: TargetPromoters) -> None:
        """One target's backlog; a failure of its server, of the store or of the code
        is logged and tried again later, after a pause that doubles with each failure
        in a row (up to a minute): a target that refuses at once is not hammered."""
        key = (lease.sink_id, target.name)
        if time.monotonic() < self._not_before.get(key, 0.0):
            return
        try:
            self._catch_up(lease, target, quarantined=False)
            self._failures.pop(key, None)
        except (FencedError, _Stopped):
            raise
        except Exception as exc:  # a thread that died would leave the target behind
            failures = self._failures[key] = self._failures.get(key, 0) + 1
            pause = min(_MAX_PAUSE_S, self._poll_s * 2**failures)
            self._not_before[key] = time.monotonic() + pause
            if isinstance(exc, TARGET_FAILURES):
                self._targets.lagging(lease.sink_id, target.name, f"{type(exc).__name__}: {exc}")
            log.warning(
                "sink %s: target %s is still behind: %s",
                lease.sink_id,
                target.name,
                exc,
                exc_info=not isinstance(exc, TwoPhaseError),
                extra=lease_fields(lease),
            )

    def _catch_up(
        self, lease: Lease, target: TargetPromoters, *, quarantined: bool
    ) -> list[tuple[str, int]]:
        check = self._stoppable(target.catch_up.lease_check(lease))
        done: list[tuple[str, int]] = []
        while not self._stop.is_set():
            # Looked at first without the lock: nothing missing, the usual answer, costs
            # one query and no session of its own.
            if self._targets.next_missing(lease.sink_id, target.name, quarantined) is None:
                return done
            with self._db.session_lock(f"twophase-target:{lease.sink_id}:{target.name}"):
                missing = self._targets.next_missing(lease.sink_id, target.name, quarantined)
                if missing is None:  # another process delivered it meanwhile
                    return done
                self._deliver(lease, target, missing, check)
            done.append((target.name, missing[0]))
        return done

    def _deliver(
        self,
        lease: Lease,
        target: TargetPromoters,
        missing: tuple[int, bool],
        check: Callable[[], None],
    ) -> None:
        epoch, purged = missing
        if purged:  # only a quarantined target can lack a purged epoch: resync's case
            log.warning(
                "sink %s: epoch %d was purged from staging before target %s had it; skipped",
                lease.sink_id,
                epoch,
                target.name,
                extra=lease_fields(lease, epoch),
            )
            self._targets.skip_purged(lease.sink_id, target.name, epoch)
            return
        plan = self._reader.plan(lease.sink_id, epoch)
        counts = target.catch_up.deliver(plan, check)
        state = self._targets.delivered(lease.sink_id, target.name, epoch, counts, lease.run_id)
        log.info(
            "sink %s: epoch %d delivered to target %s (catching up; now %s)",
            lease.sink_id,
            epoch,
            target.name,
            state,
            extra=lease_fields(lease, epoch),
        )

    def _stoppable(self, check: Callable[[], None]) -> Callable[[], None]:
        def before_request() -> None:
            if self._stop.is_set():
                raise _Stopped("the catch-up worker was closed")
            check()

        return before_request
