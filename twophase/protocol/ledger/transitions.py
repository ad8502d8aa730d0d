"""Steps of the epoch state machine, each inside the caller's transaction.

The [`Ledger`][twophase.protocol.ledger.epoch_ledger.Ledger] (Spark's epochs) and the
[`Requeuer`][twophase.operations.requeuer.Requeuer] (an operator's corrections) compose
these: lock the sink row and check the caller's fencing token (I5), insert
a decision (I1), count a promotion attempt, record an event. The driver's two
steps of every epoch are here whole, each one call in its transaction: the
vote ([`vote`][twophase.protocol.ledger.transitions.vote]) and the mark
([`mark_committed`][twophase.protocol.ledger.transitions.mark_committed]). Every step
that changes an epoch also keeps the sink's running totals
(``twophase.store.schema.SINK_COUNTERS``) in the same transaction, so the totals
are exactly as true as the epochs and a metrics scrape reads one row per
sink.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any

import psycopg

from twophase.errors import CheckpointResetError, FencedError, PermanentError, StateError
from twophase.model import CommitMessage, EpochPlan, EpochState, Lease
from twophase.protocol.deliver.reader import decided_writes

Cursor = psycopg.Cursor[Any]
# (write_id, points, rejected rows, checksum) of one chosen write
WriteRow = tuple[uuid.UUID, int, int, str]


@dataclass(frozen=True)
class Decision:
    """The outcome of a vote: the epoch's state afterwards and whether it was a replay."""

    sink_id: str
    epoch: int
    state: EpochState
    replay: bool
    points_staged: int
    plan: EpochPlan | None = None  # with start_promotion, for a PRECOMMITTED outcome


_SINK_COLUMNS = (
    "fencing_token",
    "owner_run_id",
    "query_id",
    "last_decided_epoch",
    "corrections",
    "compacted_through",
)


def lock_sink(cur: Cursor, sink_id: str) -> dict[str, Any]:
    """Lock the sink's row for the transaction (serialises its steps); its columns."""
    cur.execute(
        "SELECT fencing_token, owner_run_id, query_id, last_decided_epoch, corrections,"
        " compacted_through FROM twophase_sinks WHERE sink_id = %s FOR UPDATE",
        (sink_id,),
    )
    row = cur.fetchone()
    if row is None:
        raise StateError(f"unknown sink {sink_id!r}")
    return dict(zip(_SINK_COLUMNS, row, strict=True))


def check_fence(sink: dict[str, Any], lease: Lease) -> None:
    if sink["fencing_token"] != lease.token:
        raise FencedError(
            f"run {lease.run_id} of sink {lease.sink_id!r} was fenced by a newer run "
            f"({sink['owner_run_id']}); this run may no longer decide or commit epochs"
        )


def count_fenced(cur: Cursor, sink_id: str) -> None:
    """Count a step refused to a fenced run (its own transaction: the step's rolled back)."""
    cur.execute(
        "UPDATE twophase_sinks SET fenced_attempts = fenced_attempts + 1 WHERE sink_id = %s",
        (sink_id,),
    )


def epoch_row(cur: Cursor, sink_id: str, epoch: int) -> tuple[EpochState, int] | None:
    cur.execute(
        "SELECT state, points_staged FROM twophase_epochs WHERE sink_id = %s AND epoch = %s",
        (sink_id, epoch),
    )
    row = cur.fetchone()
    return (EpochState(row[0]), row[1]) if row else None


def state_of(cur: Cursor, sink_id: str, epoch: int) -> str:
    row = epoch_row(cur, sink_id, epoch)
    return row[0] if row else "not recorded"


def count_pending(cur: Cursor, sink_id: str) -> int:
    # The state written out: the partial index of PRECOMMITTED epochs serves a generic
    # plan only so (a parameter would read every epoch of the sink).
    cur.execute(
        "SELECT count(*) FROM twophase_epochs WHERE state = 'PRECOMMITTED' AND sink_id = %s",
        (sink_id,),
    )
    row = cur.fetchone()
    return int(row[0]) if row else 0


# The decision, the sink's totals and the epoch's event in one statement (one round
# trip). Bytes as stored and sent: a gzip member's, or a text body's (octet_length of
# text TOASTed with lz4 is read from its header: no decompression). A correction
# (negative epoch) leaves the sink's last decided epoch and query alone. ``a`` is 1
# when the caller promotes next: the first promotion attempt is counted here, as
# `start_attempt` would count it in a statement of its own.
_DECIDE = (
    "WITH d AS (INSERT INTO twophase_epochs (sink_id, epoch, state, run_id, query_id,"
    " write_ids, checksum, points_staged, points_rejected_stage, promote_attempts,"
    " staged_bytes) VALUES (%(s)s, %(e)s, %(state)s, %(run)s, %(q)s, %(ids)s, %(sum)s,"
    " %(n)s, %(r)s, %(a)s, (SELECT COALESCE(sum(COALESCE(octet_length(body_gz),"
    " octet_length(body))), 0) FROM twophase_staged_chunks WHERE write_id = ANY(%(ids)s)))"
    " RETURNING staged_bytes),"
    " t AS (UPDATE twophase_sinks SET"
    " last_decided_epoch = CASE WHEN %(e)s >= 0 THEN %(e)s ELSE last_decided_epoch END,"
    " query_id = CASE WHEN %(e)s >= 0 THEN COALESCE(query_id, %(q)s) ELSE query_id END,"
    " points_staged = points_staged + %(n)s,"
    " points_rejected_stage = points_rejected_stage + %(r)s,"
    " staged_bytes = staged_bytes + (SELECT staged_bytes FROM d),"
    " promote_attempts = promote_attempts + %(a)s,"
    " updated_at = now()"
    " WHERE sink_id = %(s)s),"
    " ev AS (INSERT INTO twophase_epoch_events (sink_id, epoch, event, run_id, detail)"
    " VALUES (%(s)s, %(e)s, 'decided', %(run)s, %(detail)s))"
    " SELECT staged_bytes FROM d"
)


def insert_decision(
    cur: Cursor,
    lease: Lease,
    epoch: int,
    refs: Sequence[WriteRow],
    detail: str = "",
    *,
    start_promotion: bool = False,
) -> Decision:
    """Record ``epoch`` PRECOMMITTED with exactly these writes (I1) and count it.

    A Spark epoch (``epoch >= 0``) also becomes the sink's last decided one; a
    correction (negative) does not, so Spark's sequence is untouched. With
    ``start_promotion`` the first promotion attempt is counted too and the
    decision carries the plan (what `start_attempt` does, without its statements).
    """
    points = sum(r[1] for r in refs)
    rejected = sum(r[2] for r in refs)
    ids = [r[0] for r in refs]
    state = EpochState.PRECOMMITTED
    what = f"{len(refs)} writes, {points} points, {rejected} rejected at stage{detail}"
    params = {
        "s": lease.sink_id,
        "e": epoch,
        "state": state,
        "run": lease.run_id,
        "q": lease.query_id,
        "ids": ids,
        "sum": _combine_checksums(sorted(r[3] for r in refs)),
        "n": points,
        "r": rejected,
        "a": int(start_promotion),
        "detail": what,
    }
    cur.execute(_DECIDE, params)
    plan = _plan(cur, lease, epoch) if start_promotion else None
    return Decision(lease.sink_id, epoch, state, False, points, plan)


def reset_hint(sink_id: str) -> str:
    """What an error refusing a query's epochs tells the operator to do."""
    return (
        f"if the checkpoint was reset on purpose, run `twophase reset --sink {sink_id}` "
        "(or use a new sink id); otherwise restart the query from its original checkpoint"
    )


def vote(
    cur: Cursor,
    lease: Lease,
    epoch: int,
    messages: Sequence[CommitMessage],
    store: str,
    start_promotion: bool,
    *,
    read_back: bool = False,
) -> Decision:
    """The decision step, whole: lock the sink, check the lease (I5) and the query (I6),
    then record ``epoch`` with exactly the writes in ``messages`` (I1), or count a
    replay of the decided epoch. ``read_back``: an earlier attempt of this step may
    have decided it already (its commit landed before the connection dropped).
    ``start_promotion``: a PRECOMMITTED outcome also counts a promotion attempt and
    carries the plan. ``store`` names this driver's staging store in the errors."""
    sink = lock_sink(cur, lease.sink_id)
    check_fence(sink, lease)
    if sink["query_id"] is not None and lease.query_id != sink["query_id"]:
        raise CheckpointResetError(
            f"sink {lease.sink_id!r} belongs to query {sink['query_id']}, not "
            f"{lease.query_id}: {reset_hint(lease.sink_id)}"
        )
    ids = [m.write_id for m in messages]
    decision = (read_back and own_decision(cur, lease.sink_id, epoch, ids)) or _vote(
        cur, sink, lease, epoch, messages, store, start_promotion
    )
    started = decision.plan is not None  # a new decision counted its attempt already
    if start_promotion and decision.state == EpochState.PRECOMMITTED and not started:
        decision = replace(decision, plan=start_attempt(cur, lease, epoch))
    return decision


def own_decision(
    cur: Cursor, sink_id: str, epoch: int, write_ids: Collection[str]
) -> Decision | None:
    """The epoch's decision when it names exactly ``write_ids`` (an earlier attempt of
    the same step decided it, and its commit landed before the connection dropped);
    None otherwise. Write ids are fresh per staging, so no other step names the same."""
    cur.execute(
        "SELECT state, points_staged, write_ids FROM twophase_epochs"
        " WHERE sink_id = %s AND epoch = %s",
        (sink_id, epoch),
    )
    row = cur.fetchone()
    if not write_ids or row is None or set(row[2]) != {uuid.UUID(w) for w in write_ids}:
        return None
    return Decision(sink_id, epoch, EpochState(row[0]), False, row[1])


def start_attempt(cur: Cursor, lease: Lease, epoch: int) -> EpochPlan:
    """Count a promotion attempt of a PRECOMMITTED epoch (a retry after the first);
    its writes in promotion order."""
    cur.execute(
        "UPDATE twophase_epochs SET promote_attempts = promote_attempts + 1"
        " WHERE sink_id = %s AND epoch = %s AND state = %s RETURNING promote_attempts",
        (lease.sink_id, epoch, EpochState.PRECOMMITTED),
    )
    row = cur.fetchone()
    if row is None:
        raise StateError(f"sink {lease.sink_id!r} epoch {epoch} is not PRECOMMITTED")
    cur.execute(
        "UPDATE twophase_sinks SET promote_attempts = promote_attempts + 1,"
        " promote_retries = promote_retries + %s WHERE sink_id = %s",
        (int(row[0] > 1), lease.sink_id),
    )
    return _plan(cur, lease, epoch)


def _plan(cur: Cursor, lease: Lease, epoch: int) -> EpochPlan:
    return EpochPlan(lease.sink_id, epoch, decided_writes(cur, lease.sink_id, epoch))


def mark_committed(
    cur: Cursor,
    lease: Lease,
    epoch: int,
    delivered: int,
    rejected: int,
    within: Callable[[Cursor], object] | None = None,
) -> None:
    """The mark step, whole: lock the sink, check the lease (I5), run ``within`` (the
    targets' deliveries recorded under the lock, safe to repeat), then PRECOMMITTED ->
    COMMITTED with the sink's totals and the epoch's event in one statement. Nothing
    changes for an epoch already COMMITTED; StateError for one in another state."""
    check_fence(lock_sink(cur, lease.sink_id), lease)
    if within is not None:
        within(cur)
    params = {
        "e": epoch,
        "d": delivered,
        "r": rejected,
        "s": lease.sink_id,
        "run": lease.run_id,
        "detail": f"delivered {delivered}, rejected {rejected}",
    }
    cur.execute(_MARK, params)
    row = cur.fetchone()
    if row and row[0]:
        return
    state = state_of(cur, lease.sink_id, epoch)
    if state != EpochState.COMMITTED:
        raise StateError(f"sink {lease.sink_id!r} epoch {epoch} is {state}, not PRECOMMITTED")


# The epoch's state, then (only if it changed) the sink's totals and the event.
_MARK = (
    "WITH m AS (UPDATE twophase_epochs SET state = 'COMMITTED', committed_at = now(),"
    " last_error = NULL, points_delivered = %(d)s, points_rejected_promote = %(r)s"
    " WHERE sink_id = %(s)s AND epoch = %(e)s AND state = 'PRECOMMITTED' RETURNING 1),"
    " totals AS (UPDATE twophase_sinks SET last_committed_epoch = CASE WHEN %(e)s >= 0 THEN"
    " GREATEST(%(e)s, COALESCE(last_committed_epoch, %(e)s)) ELSE last_committed_epoch END,"
    " epochs_committed = epochs_committed + 1, points_delivered = points_delivered + %(d)s,"
    " points_rejected_promote = points_rejected_promote + %(r)s, last_committed_at = now(),"
    " last_error = NULL, updated_at = now()"
    " WHERE sink_id = %(s)s AND EXISTS (SELECT 1 FROM m)),"
    " e AS (INSERT INTO twophase_epoch_events (sink_id, epoch, event, run_id, detail)"
    " SELECT %(s)s, %(e)s, 'committed', %(run)s, %(detail)s WHERE EXISTS (SELECT 1 FROM m))"
    " SELECT EXISTS (SELECT 1 FROM m)"
)


def release_requeued(cur: Cursor, sink_id: str, correction: int) -> None:
    """An aborted correction's dead letters are dead letters again (not requeued)."""
    cur.execute(
        "WITH freed AS (UPDATE twophase_dead_letters SET requeued_in = NULL, requeued_at = NULL"
        " WHERE sink_id = %(s)s AND requeued_in = %(c)s RETURNING 1)"
        " UPDATE twophase_sinks SET points_requeued = points_requeued"
        " - (SELECT count(*) FROM freed) WHERE sink_id = %(s)s",
        {"s": sink_id, "c": correction},
    )


def _combine_checksums(checksums: Sequence[str]) -> str:
    return hashlib.blake2b("".join(checksums).encode(), digest_size=16).hexdigest()


def event(
    cur: Cursor, sink_id: str, epoch: int | None, name: str, run_id: str | None, detail: str | None
) -> None:
    """Append to the epoch's (or, epoch None, the sink's) history."""
    cur.execute(
        "INSERT INTO twophase_epoch_events (sink_id, epoch, event, run_id, detail)"
        " VALUES (%s, %s, %s, %s, %s)",
        (sink_id, epoch, name, run_id, detail),
    )


def _vote(
    cur: Cursor,
    sink: dict[str, Any],
    lease: Lease,
    epoch: int,
    messages: Sequence[CommitMessage],
    store: str,
    start_promotion: bool,
) -> Decision:
    existing = epoch_row(cur, lease.sink_id, epoch)
    if existing is not None:
        return _count_replay(cur, lease, epoch, existing)
    floor = sink["compacted_through"]
    if floor is not None and 0 <= epoch <= floor:
        # GC compacted the epoch's record: every decided epoch up to the floor was
        # COMMITTED and delivered, so this is a replay of one (I4), skipped as such.
        compacted = (EpochState.COMMITTED, 0)
        return _count_replay(cur, lease, epoch, compacted, f" (compacted, up to {floor})")
    last = sink["last_decided_epoch"]
    if last is not None and epoch <= last:
        raise StateError(
            f"sink {lease.sink_id!r}: epoch {epoch} is not recorded but the sink has "
            f"decided up to epoch {last}; the checkpoint does not match the staging "
            f"store: {reset_hint(lease.sink_id)}"
        )
    refs = _checked_writes(cur, lease.sink_id, epoch, messages, store)
    return insert_decision(cur, lease, epoch, refs, start_promotion=start_promotion)


def _count_replay(
    cur: Cursor, lease: Lease, epoch: int, existing: tuple[EpochState, int], note: str = ""
) -> Decision:
    state, points = existing
    cur.execute(
        "UPDATE twophase_epochs SET replays = replays + 1 WHERE sink_id = %s AND epoch = %s",
        (lease.sink_id, epoch),
    )
    cur.execute(
        "UPDATE twophase_sinks SET replays_detected = replays_detected + 1 WHERE sink_id = %s",
        (lease.sink_id,),
    )
    detail = f"epoch was {state}{note}"
    event(cur, lease.sink_id, epoch, "replay_detected", lease.run_id, detail)
    return Decision(lease.sink_id, epoch, state, True, points)


def _checked_writes(
    cur: Cursor, sink_id: str, epoch: int, messages: Sequence[CommitMessage], store: str
) -> list[WriteRow]:
    ids = [uuid.UUID(m.write_id) for m in messages]
    if len(set(ids)) != len(ids):
        raise PermanentError(f"sink {sink_id!r} epoch {epoch}: a write id is named twice")
    cur.execute(
        "SELECT write_id, points, rejected, checksum FROM twophase_writes"
        " WHERE write_id = ANY(%s) AND sink_id = %s AND epoch = %s",
        (ids, sink_id, epoch),
    )
    found = {row[0]: row for row in cur.fetchall()}
    missing = [str(i) for i in ids if i not in found]
    elsewhere = sorted({m.store for m in messages if m.store and m.store != store})
    if missing and elsewhere:
        raise PermanentError(
            f"sink {sink_id!r} epoch {epoch}: the tasks staged into {', '.join(elsewhere)}, but"
            f" this driver decides in {store}: give the executors the driver's staging store"
            " (spark.executorEnv.TWOPHASE_STAGING_URL, or the staging_url option)"
        )
    if missing:
        raise PermanentError(
            f"sink {sink_id!r} epoch {epoch}: writes {', '.join(missing)} are not staged "
            "(removed by GC or staged for another sink/epoch); the epoch must be re-run"
        )
    return [found[i] for i in ids]
