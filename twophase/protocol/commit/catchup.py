"""Catching a target up: delivers a lagging target's backlog from staging, oldest first.

A target a commit left without its epoch (a
[`Promoter`][twophase.protocol.commit.promoter.Promoter]'s) is owed every COMMITTED
epoch past its cursor, and the corrections it lacks. The worker delivers them to it one
at a time, in epoch order, each with the whole ``target_retry_deadline``, and
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
The lock lives on a session of its own, which a PostgreSQL restart ends while
the holder goes on: the holder checks that it still holds the lock before
every request (``HeldLock.check``), as it checks its lease, and before it
records the delivery, so a lost lock stops it (``LockLostError``) before
another holder's epoch can be crossed by one of its own.

A commit whose caught-up targets cannot make ``min_targets`` catches a
reachable lagging target up itself (`CatchUp.below`), in epoch order and
under the same lock, before it sends it the epoch: the availability rule
(I10).

In a driver the worker runs on a daemon thread per sink from the run's claim
until the process closes it, looking for a backlog every ``poll_s`` and at
once when a commit leaves a target behind (a target whose delivery failed is
tried again after a pause doubling with each failure, up to a minute); it
checks the run's lease before every request, outlives every failure of its
own, and ends for good when the run is fenced. Quarantined targets are left
to ``twophase targets resync``.

A target with a ``target_catch_up_rate`` is caught up at that many points per
second ([`twophase.protocol.deliver.pacing`][twophase.protocol.deliver.pacing]), one bucket per sink
and target in the process, whichever way it is caught up (the worker, ``below``,
``recover``, ``resync``): each request waits its turn before the checks that precede
it (the lease, the lock), so they are as fresh as ever when it goes; the debt of an
epoch's last request is waited off before the next epoch is delivered (and at the
end of a catch-up, but a commit's), holding neither the target's lock nor a
transaction. A commit's own epoch to a caught-up target is never paced (it is not
sent here).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from twophase.errors import (
    TARGET_FAILURES,
    FencedError,
    PermanentError,
    TargetOrderError,
    TwoPhaseError,
)
from twophase.logs import lease_fields
from twophase.model import Lease
from twophase.protocol.deliver.delivery import TargetDelivery
from twophase.protocol.deliver.pacing import TokenBucket, counted
from twophase.protocol.deliver.reader import StagedReader
from twophase.protocol.ledger.epoch_ledger import Ledger
from twophase.protocol.ledger.target_ledger import TargetLedger
from twophase.store.database import Database
from twophase.store.locks import HeldLock, LockOwner

__all__ = ["CatchUp", "CatchUpReport", "target_lock"]

log = logging.getLogger("twophase.protocol.catchup")
_POLL_S = 2.0  # how often a driver's worker looks for a backlog when not told of one
_CLOSE_WAIT_S = 10.0
_MAX_PAUSE_S = 60.0  # the longest wait before trying a failing target again


@dataclass(frozen=True)
class CatchUpReport:
    """What a catch-up run did: (target, epoch) of each epoch delivered (or, purged,
    passed over), and the failure of each target it could not catch up."""

    delivered: tuple[tuple[str, int], ...]
    failed: tuple[tuple[str, TwoPhaseError], ...] = ()


class _Stopped(TwoPhaseError):
    """The worker was closed, or the caller no longer needs the target: no request more."""


def _never() -> None:
    """A catch-up nobody stops but a failure: the caller's own."""


def target_lock(sink_id: str, target: str) -> str:
    """The name of the advisory lock that orders a target's deliveries (a catch-up's,
    and a removal's)."""
    return f"twophase-target:{sink_id}:{target}"


class CatchUp:
    """Delivers lagging targets' backlogs, in epoch order, one epoch at a time.

    Idempotent: each epoch is delivered under the target's lock and recorded before
    the next is taken; a repeat after a crash re-sends at most the epoch whose record
    was lost (I4)."""

    def __init__(
        self,
        db: Database,
        ledger: Ledger,
        reader: StagedReader,
        targets: TargetLedger,
        deliveries: Sequence[TargetDelivery],
        poll_s: float = _POLL_S,
        rates: Mapping[str, float] | None = None,
    ) -> None:
        """``rates``: each target's ``target_catch_up_rate`` by name (points per second;
        absent or 0: not paced)."""
        self._db = db
        self._ledger = ledger
        self._reader = reader
        self._targets = targets
        self._deliveries = tuple(deliveries)
        self._poll_s = poll_s
        self._rates = {name: rate for name, rate in (rates or {}).items() if rate > 0}
        self._buckets: dict[tuple[str, str], TokenBucket] = {}
        self._lock = threading.Lock()
        self._threads: dict[str, threading.Thread] = {}
        self._leases: dict[str, Lease] = {}
        # by (sink, target), each touched by that sink's thread only
        self._failures: dict[tuple[str, str], int] = {}
        self._not_before: dict[tuple[str, str], float] = {}
        self._woken: dict[str, threading.Event] = {}
        self._stop = threading.Event()

    def watch(self, lease: Lease) -> None:
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

    def run(
        self, lease: Lease, names: Sequence[str] | None = None, *, quarantined: bool = False
    ) -> CatchUpReport:
        """Deliver the backlog of every target (of ``names``) now, on this thread, target
        after target; a target that fails is reported and the others are still caught
        up. ``quarantined``: quarantined targets too (a resync). FencedError at once."""
        done: list[tuple[str, int]] = []
        failed: list[tuple[str, TwoPhaseError]] = []
        for target in self._deliveries:
            if names is not None and target.name not in names:
                continue
            try:  # on the caller's thread: closing the worker does not stop it
                done += self._catch_up(lease, target, quarantined=quarantined, stop=_never)
            except FencedError:
                raise
            except TARGET_FAILURES as exc:
                failed.append((target.name, exc))
                self._targets.lagging(lease.sink_id, target.name, f"{type(exc).__name__}: {exc}")
        return CatchUpReport(tuple(done), tuple(failed))

    def below(
        self,
        lease: Lease,
        name: str,
        epoch: int,
        enough: Callable[[], bool],
        *,
        round_only: bool = True,
        progress: Callable[[int], None] | None = None,
        guard: Callable[[], None] = _never,
    ) -> bool:
        """Deliver target ``name``'s backlog below ``epoch``, in order, now: a commit
        whose caught-up targets cannot make ``min_targets`` catches a reachable lagging one
        up before it sends it the epoch. Each epoch within ``target_deadline`` (a commit's
        round; ``round_only`` False: within ``target_retry_deadline``); stops once
        ``enough()`` (the others made it meanwhile, or the commit gave up), and waits for
        the target's lock (another process catching it up) only while not ``enough()``.
        ``guard``, the commit's own check (a recovery's lock), runs with ``enough`` before
        every request and between the lock's tries, and stops the catch-up by raising.
        True once the target holds every epoch below ``epoch``; False when stopped."""

        def stop() -> None:
            if enough():
                raise _Stopped("enough targets hold the epoch")
            guard()

        target = next(t for t in self._deliveries if t.name == name)
        try:
            self._catch_up(
                lease,
                target,
                quarantined=False,
                below=epoch,
                stop=stop,
                round_only=round_only,
                progress=progress,
            )
        except _Stopped:
            return False
        return True

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
                for target in self._deliveries:
                    self._try(lease, target)
            except FencedError as exc:
                if self._fenced(sink_id, lease, exc):
                    return
                continue
            except _Stopped:
                return
            woken.wait(self._poll_s)

    def _fenced(self, sink_id: str, lease: Lease, exc: FencedError) -> bool:
        """Whether the sink's worker ends: no newer run of ours to go on with."""
        with self._lock:
            if self._leases[sink_id] != lease:
                return False
            log.info("sink %s: catch-up ends, fenced: %s", sink_id, exc, extra=lease_fields(lease))
            del self._threads[sink_id]
            return True

    def _try(self, lease: Lease, target: TargetDelivery) -> None:
        """One target's backlog; a failure of its server, of the store or of the code
        is logged and tried again later, after a pause that doubles with each failure
        in a row (up to a minute): a target that refuses at once is not hammered. The
        worker outlives every failure here, its own bookkeeping's included."""
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
            self._not_before[key] = time.monotonic() + min(_MAX_PAUSE_S, self._poll_s * 2**failures)
            self._record_failure(lease, target.name, exc)

    def _record_failure(self, lease: Lease, name: str, exc: Exception) -> None:
        log.warning(
            "sink %s: target %s is still behind: %s",
            lease.sink_id,
            name,
            exc,
            exc_info=not isinstance(exc, TwoPhaseError),
            extra=lease_fields(lease),
        )
        if not isinstance(exc, TARGET_FAILURES):
            return
        try:  # the store may be what failed: its record waits for the next failure
            self._targets.lagging(lease.sink_id, name, f"{type(exc).__name__}: {exc}")
        except Exception as again:
            log.warning(
                "sink %s: target %s: its state was not recorded: %s",
                lease.sink_id,
                name,
                again,
                extra=lease_fields(lease),
            )

    def _catch_up(
        self,
        lease: Lease,
        target: TargetDelivery,
        *,
        quarantined: bool,
        below: int | None = None,
        stop: Callable[[], None] | None = None,
        round_only: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> list[tuple[str, int]]:
        fenced = self._ledger.watch(lease)
        # A commit's catch-up (``stop``) answers to its commit alone; the others end
        # when the worker is closed.
        stop = stop or self._closing
        pace = self._bucket(lease.sink_id, target.name)
        done: list[tuple[str, int]] = []
        while True:
            stop()
            # Looked at first without the lock: nothing missing, the usual answer, costs
            # one query and no session of its own.
            missing = self._targets.next_missing(lease.sink_id, target.name, quarantined, below)
            if pace is not None and (missing is not None or below is None):
                # The last request's debt, waited off holding no lock and no transaction
                # (and so at the end of a catch-up, which then keeps to the rate: but not
                # a commit's, whose own epoch goes next and unpaced).
                pace.wait(stop)
            if missing is None:
                return done
            owner = LockOwner(lease.sink_id, lease.token)
            name = target_lock(lease.sink_id, target.name)
            with self._db.session_lock(name, owner, stop) as held:
                missing = self._targets.next_missing(lease.sink_id, target.name, quarantined, below)
                if missing is None:  # another process delivered it meanwhile
                    return done
                check = self._checks(fenced, held, stop)
                before, sent = _paced(pace, check, stop, progress)
                self._deliver(lease, target, missing, (before, check), round_only, sent)
            done.append((target.name, missing[0]))
        return done

    def _bucket(self, sink_id: str, target: str) -> TokenBucket | None:
        """The target's bucket, for a catch-up that begins (made on first use, kept for
        the process: a catch-up pays what the last one still owes, and starts with
        nothing saved up); None when the target is not paced."""
        rate = self._rates.get(target)
        if rate is None:
            return None
        with self._lock:
            bucket = self._buckets.setdefault((sink_id, target), TokenBucket(rate))
        bucket.start()
        return bucket

    def _closing(self) -> None:
        if self._stop.is_set():
            raise _Stopped("the catch-up worker was closed")

    def _checks(
        self, fenced: Callable[[], None], held: HeldLock, stop: Callable[[], None]
    ) -> Callable[[], None]:
        """What runs before every request: the caller still in need of it (``stop``: the
        worker still open, or the commit still short of targets), the run's lease, and
        the target's lock still held (a lost session releases it: another process may
        be delivering to the target)."""

        def before_request() -> None:
            stop()
            fenced()
            held.check()

        return before_request

    def _deliver(
        self,
        lease: Lease,
        target: TargetDelivery,
        missing: tuple[int, bool],
        checks: tuple[Callable[[], None], Callable[[], None]],
        round_only: bool,
        progress: Callable[[int], None] | None,
    ) -> None:
        """Deliver one epoch and record it; ``checks``: what runs before each request
        (paced), and the check before the record (never waits)."""
        before, check = checks
        epoch, purged = missing
        if purged:  # only a quarantined target can lack a purged epoch: resync's case
            log.warning(
                "sink %s: epoch %d was purged from staging before target %s had it; skipped",
                lease.sink_id,
                epoch,
                target.name,
                extra=lease_fields(lease, epoch),
            )
            self._targets.skip_purged(lease, target.name, epoch)
            return
        plan = self._reader.plan(lease.sink_id, epoch)
        try:
            counts = target.deliver(plan, before, round_only=round_only, on_batch=progress)
        except PermanentError:
            if not self._targets.purged(lease.sink_id, epoch):
                raise  # damaged: for an operator (I1)
            # A collection quarantined the target and purged the epoch under the send:
            # not damage, and not the commit's business; the next look skips it.
            raise TargetOrderError(
                f"sink {lease.sink_id!r} epoch {epoch} was purged by GC while it was sent "
                f"to target {target.name!r} (quarantined meanwhile); not recorded",
                target.name,
            ) from None
        check()  # the lock still held: no other delivery of the target crossed this one
        state = self._targets.delivered(lease, target.name, epoch, counts)
        log.info(
            "sink %s: epoch %d delivered to target %s (catching up; now %s)",
            lease.sink_id,
            epoch,
            target.name,
            state,
            extra=lease_fields(lease, epoch),
        )


def _paced(
    pace: TokenBucket | None,
    check: Callable[[], None],
    stop: Callable[[], None],
    progress: Callable[[int], None] | None,
) -> tuple[Callable[[], None], Callable[[int], None] | None]:
    """A delivery's ``check`` and ``on_batch`` under ``pace``: each request waits its
    turn (stopped by ``stop``), then ``check`` runs (the lease, the lock: checked after
    the wait, just before the request); each request sent is paid for, and reported
    to ``progress``. Unchanged without a pace."""
    if pace is None:
        return check, progress
    paid = counted(pace)

    def before_request() -> None:
        pace.wait(stop)
        check()

    def sent(points: int) -> None:
        paid(points)
        if progress is not None:
            progress(points)

    return before_request, sent
