"""The epoch ledger: runs, fencing, and the epoch state machine in PostgreSQL.

    (none) --decide--> PRECOMMITTED --mark--> COMMITTED
                           +--abort (operator)--> ABORTED

Each method is one transaction that first locks the sink row, so decisions
and marks of one sink are serialised, and checks the caller's fencing token
(I5). Contracts per method are in their docstrings.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from twophase.errors import (
    CheckpointResetError,
    FencedError,
    LockLostError,
    RecoveryLockLostError,
    StagingUnavailableError,
    StateError,
)
from twophase.faults import crash_point
from twophase.model import CommitMessage, EpochPlan, EpochState, Lease, check_sink_id
from twophase.protocol.ledger.transitions import (
    Cursor,
    Decision,
    check_fence,
    count_fenced,
    count_pending,
    event,
    lock_sink,
    mark_committed,
    release_requeued,
    reset_hint,
    start_attempt,
    state_of,
    vote,
)
from twophase.store.database import Database
from twophase.store.fencing import FenceReader
from twophase.store.locks import HeldLock, LockOwner

__all__ = ["Decision", "Forgotten", "Ledger"]


@dataclass(frozen=True)
class Forgotten:
    """What a reset did: the epoch records it deleted, the dead letters the sink keeps."""

    epochs: int
    dead_letters_kept: int


class Ledger:
    """Driver side state machine. One role: decide, mark, abort, and who may do so."""

    def __init__(self, db: Database):
        self._db = db
        self._store = db.config.display_url  # named in a vote's errors, and the fence's
        # the fencing reads' own session, shared by the lanes (opened at the first read)
        self._fence = FenceReader(db.session, self._store)

    def close(self) -> None:
        """End the fencing reads' session (the pool is the caller's). Idempotent."""
        self._fence.close()

    @contextmanager
    def _fenced_counted(self, sink_id: str) -> Iterator[None]:
        """Count a step refused to a fenced run (metrics: a fenced run still active)."""
        try:
            yield
        except FencedError:
            # The refusal is what matters: a store gone meanwhile must not hide it.
            with contextlib.suppress(StagingUnavailableError), self._db.transaction() as cur:
                count_fenced(cur, sink_id)
            raise

    # -- runs and fencing -------------------------------------------------------

    def begin_run(self, sink_id: str, run_id: str, query_id: str | None) -> Lease:
        """Claim the sink for a new run, fencing every older run (I5).

        Refuses (I6) when the sink is bound to another query that has decided
        epochs: a reset checkpoint or a second query on the same sink id. The
        older run is not fenced in that case. Calling it again for the same
        run returns that run's existing lease (idempotent), unless a newer run
        has taken the sink meanwhile: then FencedError (I5), so that a zombie
        driver's new process cannot take the sink back.
        """
        check_sink_id(sink_id)
        return self._db.retry("claim", lambda: self._begin_run(sink_id, run_id, query_id))

    def _begin_run(self, sink_id: str, run_id: str, query_id: str | None) -> Lease:
        with self._fenced_counted(sink_id), self._db.transaction() as cur:
            cur.execute(
                "INSERT INTO twophase_sinks (sink_id) VALUES (%s) ON CONFLICT DO NOTHING",
                (sink_id,),
            )
            sink = lock_sink(cur, sink_id)
            if sink["owner_run_id"] == run_id:
                return Lease(sink_id, run_id, sink["query_id"], sink["fencing_token"])
            _refuse_superseded_run(cur, sink_id, sink, run_id)
            _refuse_other_query(sink_id, sink, query_id)
            token = sink["fencing_token"] + 1
            cur.execute(
                "UPDATE twophase_sinks SET fencing_token = %s, owner_run_id = %s,"
                " query_id = COALESCE(%s, query_id), updated_at = now() WHERE sink_id = %s",
                (token, run_id, query_id, sink_id),
            )
            cur.execute(
                "INSERT INTO twophase_runs (run_id, sink_id, query_id, fencing_token)"
                " VALUES (%s, %s, %s, %s) ON CONFLICT (sink_id, run_id) DO UPDATE SET"
                " fencing_token = EXCLUDED.fencing_token, started_at = now()",
                (run_id, sink_id, query_id, token),
            )
            event(cur, sink_id, None, "run_started", run_id, f"fencing token {token}")
            crash_point("in_begin_run", sink_id)
            return Lease(sink_id, run_id, query_id or sink["query_id"], token)

    # -- phase 2: vote and commit -------------------------------------------------

    def decide(
        self,
        lease: Lease,
        epoch: int,
        messages: Sequence[CommitMessage],
        *,
        start_promotion: bool = False,
    ) -> Decision:
        """Record ``epoch`` as PRECOMMITTED with exactly the writes in ``messages``.

        From here its point set is fixed (I1). If the epoch is already decided
        this is a replay: nothing changes but the replay counters, and the
        existing state is returned (``replay=True``); the caller promotes a
        PRECOMMITTED one from its original writes and skips a COMMITTED one.
        An epoch at or below the sink's compacted floor (``compacted_through``:
        GC deleted its record) is a replay of a COMMITTED one.
        With ``start_promotion`` (a caller that promotes next), a PRECOMMITTED
        outcome also counts a promotion attempt and carries the plan, as
        `plan_promotion` would in a transaction of its own.
        Raises FencedError for a stale lease, CheckpointResetError (I6),
        StateError for an unknown epoch below the sink's last one, and
        PermanentError if a message names a write that is not staged.

        Repeated while the staging store is unreachable. A repeat reads back
        first: an epoch already recorded with exactly these write ids was
        decided by this call's earlier attempt, whose commit landed before
        the connection dropped; it is returned as a new decision, not as a
        replay (write ids are fresh per task attempt, so a Spark replay never
        names the same ones).
        """

        def attempt(read_back: bool) -> Decision:
            return self._decide(lease, epoch, messages, start_promotion, read_back)

        return self._db.retry("decide", lambda: attempt(False), again=lambda: attempt(True))

    def _decide(
        self,
        lease: Lease,
        epoch: int,
        messages: Sequence[CommitMessage],
        start_promotion: bool,
        read_back: bool,
    ) -> Decision:
        with self._fenced_counted(lease.sink_id), self._db.transaction() as cur:
            decision = vote(
                cur, lease, epoch, messages, self._store, start_promotion, read_back=read_back
            )
            crash_point("in_decide", lease.sink_id)
            return decision

    def plan_promotion(self, lease: Lease, epoch: int) -> EpochPlan:
        """Count a promotion attempt and return the epoch's fixed writes, in promotion
        order ([`reader.decided_writes`][twophase.protocol.deliver.reader.decided_writes]).

        Raises FencedError for a stale lease and StateError unless the epoch
        is PRECOMMITTED. (Repeated after an outage, it may count one attempt more.)
        """
        return self._db.retry("plan promotion", lambda: self._plan_promotion(lease, epoch))

    def _plan_promotion(self, lease: Lease, epoch: int) -> EpochPlan:
        with self._fenced_counted(lease.sink_id), self._db.transaction() as cur:
            check_fence(lock_sink(cur, lease.sink_id), lease)
            plan = start_attempt(cur, lease, epoch)
            crash_point("in_plan", lease.sink_id)
            return plan

    def check_lease(self, lease: Lease) -> None:
        """FencedError if a newer run has taken the sink since ``lease`` was granted.

        One single-row read without the sink's lock: a promoter asks before
        every request and every retry of one, so that a fenced run starts no
        request more. (A target cannot refuse a fenced writer; a request already
        under way still lands, and the mark that follows is refused.) Read on a
        session of its own, shared by the lanes
        ([`FenceReader`][twophase.store.fencing.FenceReader]), never from a cache;
        repeated through an outage like every step.
        """
        self._db.retry("check lease", lambda: self._check_lease(lease))

    def _check_lease(self, lease: Lease) -> None:
        with self._fenced_counted(lease.sink_id):
            sink = self._fence.read(lease.sink_id)
            if sink is None:
                raise StateError(f"unknown sink {lease.sink_id!r}")
            check_fence(sink, lease)

    def watch(self, lease: Lease) -> Callable[[], None]:
        """A check to run before each request of a delivery under ``lease``: FencedError
        once a newer run holds the sink (one read of the sink's token per call,
        `check_lease`; once fenced, every later call raises without reading)."""
        return _LeaseWatch(functools.partial(self.check_lease, lease))

    def mark_committed(
        self,
        lease: Lease,
        epoch: int,
        delivered: int,
        rejected: int,
        within: Callable[[Cursor], object] | None = None,
    ) -> None:
        """PRECOMMITTED -> COMMITTED, after every point was acknowledged (I2).

        ``within`` runs in the same transaction first, under the sink's lock and
        the checked lease (the targets' deliveries are recorded there: one commit
        per epoch); it must be safe to repeat. Idempotent for an epoch that is
        already COMMITTED. Raises FencedError for a stale lease and StateError for
        an epoch in another state.
        """
        self._db.retry("mark", lambda: self._mark(lease, epoch, delivered, rejected, within))

    def _mark(
        self,
        lease: Lease,
        epoch: int,
        delivered: int,
        rejected: int,
        within: Callable[[Cursor], object] | None,
    ) -> None:
        with self._fenced_counted(lease.sink_id), self._db.transaction() as cur:
            mark_committed(cur, lease, epoch, delivered, rejected, within)
            crash_point("in_mark", lease.sink_id)

    def record_error(self, sink_id: str, epoch: int | None, message: str) -> None:
        """Remember why the last promotion failed (for status); no state change.

        Best effort, one attempt: a store that is down must not hide the failure
        being recorded (which is often that very outage).
        """
        with contextlib.suppress(StagingUnavailableError), self._db.transaction() as cur:
            cur.execute(
                "UPDATE twophase_sinks SET last_error = %s, updated_at = now() WHERE sink_id = %s",
                (message, sink_id),
            )
            if epoch is not None:
                cur.execute(
                    "UPDATE twophase_epochs SET last_error = %s WHERE sink_id = %s AND epoch = %s",
                    (message, sink_id, epoch),
                )
                event(cur, sink_id, epoch, "promote_failed", None, message)

    def pending(self, sink_id: str, *, other_than: str | None = None) -> list[int]:
        """The sink's PRECOMMITTED epochs in the order recovery promotes them (I3): the
        corrections in the order they were decided (-1, -2, ...), then Spark's epochs in
        increasing order.

        With ``other_than`` (a run id), only those other runs decided: what that run
        found pending when it claimed the sink. (Its own are its commits' to finish;
        they are all above those, since it decides only once it holds the sink.)
        """
        return self._db.retry("recover", lambda: self._pending(sink_id, other_than))

    def _pending(self, sink_id: str, other_than: str | None) -> list[int]:
        with self._db.transaction() as cur:
            cur.execute(
                # The state written out: a generic plan then reads the partial index of
                # PRECOMMITTED epochs, not every epoch of the sink.
                "SELECT epoch FROM twophase_epochs WHERE state = 'PRECOMMITTED' AND sink_id = %s"
                " AND (%s::text IS NULL OR run_id IS DISTINCT FROM %s)"
                " ORDER BY epoch >= 0, abs(epoch)",  # corrections first, as decided
                (sink_id, other_than, other_than),
            )
            return [row[0] for row in cur.fetchall()]

    @contextmanager
    def recovering(self, lease: Lease) -> Iterator[Callable[[], None]]:
        """Hold the sink's recovery lock: one recovery of a sink at a time, across
        processes. A run's claim and its first commit may both find an epoch pending
        (the claim on the driver, the commit in a Python worker); without the lock
        both would send it, and the commit could decide and send the next epoch while
        the claim's requests of the older one are still landing (I3). Whoever gets
        the lock second reads what is pending again and finds it done.

        Yields the check to run before every request of the recovery: the lock lives on
        a session of its own, which may end while the holder goes on (then another
        process of the run may take it): RecoveryLockLostError once it is gone."""
        owner = LockOwner(lease.sink_id, lease.token)
        # Waited for while this run still holds the sink (another recovery of this
        # run's is under way); once a newer run holds it, FencedError (I5).
        with self._db.session_lock(f"recover:{lease.sink_id}", owner, self.watch(lease)) as held:
            yield functools.partial(_still_held, held)

    # -- operator actions -------------------------------------------------------

    def abort(self, sink_id: str, epoch: int, reason: str, actor: str = "operator") -> None:
        """PRECOMMITTED -> ABORTED by an explicit operator decision; its staged points go.

        Never automatic: a decided epoch is otherwise always promoted. An aborted
        correction gives its dead letters back (no longer requeued: a later
        requeue may carry them). Raises StateError for an unknown epoch or one
        that is not PRECOMMITTED.
        """
        with self._db.transaction() as cur:
            lock_sink(cur, sink_id)
            cur.execute(
                "UPDATE twophase_epochs e SET state = %s, aborted_at = now(), last_error = %s,"
                " staged_bytes = 0 FROM (SELECT staged_bytes FROM twophase_epochs"
                " WHERE sink_id = %s AND epoch = %s) old"
                " WHERE e.sink_id = %s AND e.epoch = %s AND e.state = %s"
                " RETURNING e.write_ids, old.staged_bytes",
                (EpochState.ABORTED, reason, *(sink_id, epoch) * 2, EpochState.PRECOMMITTED),
            )
            row = cur.fetchone()
            if row is None:
                state = state_of(cur, sink_id, epoch)
                raise StateError(f"sink {sink_id!r} epoch {epoch} is {state}, not PRECOMMITTED")
            cur.execute("DELETE FROM twophase_staged_chunks WHERE write_id = ANY(%s)", (row[0],))
            cur.execute(
                "UPDATE twophase_sinks SET epochs_aborted = epochs_aborted + 1,"
                " staged_bytes = GREATEST(staged_bytes - %s, 0) WHERE sink_id = %s",
                (row[1], sink_id),
            )
            if epoch < 0:
                release_requeued(cur, sink_id, epoch)
            event(cur, sink_id, epoch, "aborted", actor, reason)

    def reset(self, sink_id: str, actor: str = "operator") -> Forgotten:
        """Unbind the sink from its query after a deliberate checkpoint reset (I6's way out).

        The next query may start at any epoch. The epoch records are deleted, so
        every write becomes an orphan for GC, and so are the per-target cursors
        and deliveries; the sink starts a new generation (a transactional target's
        records of the old epoch numbers are inert); the dead letters of the writes the
        epochs chose are marked ``reset_at`` first and stay the sink's: listed,
        requeueable, never removed by GC. Raises StateError while epochs are
        PRECOMMITTED (recover first).
        """
        with self._db.transaction() as cur:
            lock_sink(cur, sink_id)
            if count_pending(cur, sink_id):
                raise StateError(
                    f"sink {sink_id!r} has PRECOMMITTED epochs: run `twophase recover --sink "
                    f"{sink_id}` before resetting it"
                )
            kept = _keep_dead_letters(cur, sink_id)
            cur.execute(
                "DELETE FROM twophase_epochs WHERE sink_id = %s RETURNING epoch", (sink_id,)
            )
            removed = len(cur.fetchall())
            # The next query numbers its epochs from 0 again: the sink's next generation
            # (never given out before), so that a transactional target's records of the
            # old numbers (in its own store, out of reach here) skip none of the new epochs.
            cur.execute(
                "UPDATE twophase_sinks s SET generation = GREATEST(s.generation,"
                " (SELECT max(t.generation) FROM twophase_targets t WHERE t.sink_id = %s)) + 1"
                " WHERE s.sink_id = %s",
                (sink_id, sink_id),
            )
            # Its targets' cursors count the forgotten epochs; the next query's start
            # registers them again, from its first epoch, in the new generation.
            cur.execute("DELETE FROM twophase_target_deliveries WHERE sink_id = %s", (sink_id,))
            cur.execute("DELETE FROM twophase_targets WHERE sink_id = %s", (sink_id,))
            cur.execute(
                # The compacted floor goes with the epochs: the next query's epochs
                # below it are new, not replays.
                "UPDATE twophase_sinks SET query_id = NULL, last_decided_epoch = NULL,"
                " owner_run_id = NULL, fencing_token = fencing_token + 1, updated_at = now(),"
                " epochs_committed = 0, epochs_aborted = 0, staged_bytes = 0,"
                " compacted_through = NULL WHERE sink_id = %s",
                (sink_id,),
            )
            detail = f"forgot {removed} epochs, kept {kept} dead letters"
            event(cur, sink_id, None, "reset", actor, detail)
            crash_point("in_reset", sink_id)
            return Forgotten(removed, kept)


class _LeaseWatch:
    """A delivery's fencing check, shared by its lanes: one read of the sink's token
    per request or retry (`Ledger.check_lease`), never cached while the lease holds --
    a cached answer would let a request start after the new run's claim.

    Fencing is for good (a token only grows, a fenced run never claims again), so
    once a read has seen it every later call, in any lane, raises without reading.
    """

    def __init__(self, check: Callable[[], None]) -> None:
        self._check = check
        self._fenced: str | None = None

    def __call__(self) -> None:
        if self._fenced is not None:
            raise FencedError(self._fenced)
        try:
            self._check()
        except FencedError as exc:
            self._fenced = str(exc)
            raise


def _still_held(held: HeldLock) -> None:
    """The recovery lock's check: its loss is the recovery's (RecoveryLockLostError),
    never a target's failure that the others could make do without."""
    try:
        held.check()
    except LockLostError as exc:
        raise RecoveryLockLostError(f"recovery stopped before its next request: {exc}") from None


# -- helpers: each runs inside the caller's transaction -------------------------


def _keep_dead_letters(cur: Cursor, sink_id: str) -> int:
    """Mark the dead letters of the writes the sink's epochs chose as kept by a reset
    (the epochs that name those writes are about to go); how many the sink keeps."""
    cur.execute(
        "UPDATE twophase_dead_letters d SET reset_at = now() FROM twophase_epochs e"
        " WHERE e.sink_id = %s AND d.sink_id = e.sink_id AND d.epoch = e.epoch"
        " AND d.write_id = ANY(e.write_ids) AND d.reset_at IS NULL",
        (sink_id,),
    )
    cur.execute(
        "SELECT count(*) FROM twophase_dead_letters WHERE sink_id = %s AND reset_at IS NOT NULL",
        (sink_id,),
    )
    row = cur.fetchone()
    return int(row[0]) if row else 0


def _refuse_superseded_run(cur: Cursor, sink_id: str, sink: dict[str, Any], run_id: str) -> None:
    cur.execute("SELECT 1 FROM twophase_runs WHERE run_id = %s AND sink_id = %s", (run_id, sink_id))
    if cur.fetchone() is not None:
        raise FencedError(
            f"run {run_id} of sink {sink_id!r} was fenced by a newer run "
            f"({sink['owner_run_id']}); a fenced run cannot claim the sink again"
        )


def _refuse_other_query(sink_id: str, sink: dict[str, Any], query_id: str | None) -> None:
    bound = sink["query_id"]
    if bound is None or query_id is None or query_id == bound:
        return
    if sink["last_decided_epoch"] is None:
        return
    raise CheckpointResetError(
        f"sink {sink_id!r} belongs to query {bound} (decided up to epoch "
        f"{sink['last_decided_epoch']}); query {query_id} is a different query: its "
        f"checkpoint was reset, or another query uses the same sink id. {reset_hint(sink_id)}"
    )
