"""Requeue: the points a target refused, delivered again as a *correction*, exactly once.

After an operator fixes what made a target refuse points (a field type
conflict, a missing retention policy), ``twophase dead-letters --requeue``
turns the sink's promote-time dead letters into a correction: an epoch of
the sink numbered ``-n`` for its n-th correction, so it can never collide
with Spark's batch ids (0, 1, 2...), decided and promoted by the same
protocol as any epoch:

1. [`Requeuer.select`][twophase.operations.requeuer.Requeuer.select] reads a batch of the
   letters (not requeued yet, of decided writes, filtered by epoch and reason; at most
   ``REQUEUE_LETTERS`` of them and ``REQUEUE_BYTES`` of lines, oldest first) and the
   correction's number.
2. [`Requeuer.decide`][twophase.operations.requeuer.Requeuer.decide] stages their lines as one
   write of epoch ``-n`` ([`Stager`][twophase.protocol.stage.stager.Stager]), then, in one
   transaction under the sink's lock and the caller's fencing token, records the correction
   PRECOMMITTED and marks exactly those letters ``requeued_in = -n``. That transaction is
   repeated through an outage; a repeat first reads back a correction whose commit landed
   but was not acknowledged. A crash before that transaction leaves an orphan write (GC
   removes it) and the letters as they were; after it, the correction is an ordinary
   PRECOMMITTED epoch that ``twophase recover`` promotes (I3).
3. The caller promotes it ([`recover`][twophase.protocol.commit.committer.Committer.recover]).
   Points a target refuses again become dead letters of the correction --
   each point is an unrequeued dead letter exactly once at any time.

**One batch is one correction.** Many letters are requeued a batch at a time, each
selected, staged, decided and promoted before the next is read, so a requeue never
holds more than one batch's lines, and a crash leaves the batches done delivered and
the others' letters as they were (the same command again carries them). The batches
cover the letters that were there when the requeue began
([`Requeuer.summary`][twophase.operations.requeuer.Requeuer.summary] fixes the last
id): a letter a correction gets refused again is not carried again by the same
requeue.

With several targets a letter names the target that refused the point, and a
correction carries the letters of one target and is promoted to that target
only (``twophase_epochs.target``): a point one target refused and another
accepted is delivered again where it is missing, and nowhere else.

Stage-time dead letters are rows that never became points; there is
nothing to send for them, so they are counted and left alone.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from twophase.errors import StateError
from twophase.faults import crash_point
from twophase.model import CommitMessage, Lease, Phase
from twophase.protocol.ledger.transitions import (
    Cursor,
    Decision,
    check_fence,
    event,
    insert_decision,
    lock_sink,
    own_decision,
)
from twophase.protocol.stage.stager import Stager
from twophase.store.database import Database
from twophase.store.views import DECIDED_LETTER

# A correction's share of the letters: at most this many, and this many bytes of lines
# (a line may be long: the first letter of a batch is taken whatever its size).
REQUEUE_LETTERS = 10_000
REQUEUE_BYTES = 16 * 1024 * 1024

# Promote-time dead letters of decided writes (or kept by a reset, which forgot the
# epochs that chose them) not yet requeued, by the caller's filters.
_SELECTED = (
    f"FROM twophase_dead_letters d WHERE {DECIDED_LETTER}"
    " AND d.sink_id = %(sink)s AND d.phase = %(phase)s AND d.requeued_in IS NULL"
    " AND (%(epoch)s::bigint IS NULL OR d.epoch = %(epoch)s)"
    " AND (%(reason)s::text IS NULL OR strpos(lower(d.reason), lower(%(reason)s)) > 0)"
    " AND (%(target)s::text IS NULL OR d.target = %(target)s)"
)


@dataclass(frozen=True)
class RequeueFilter:
    """Which dead letters: of one epoch (None: all), whose reason contains a text,
    refused by one target (several targets; None: any, if they are all one's)."""

    epoch: int | None = None
    reason: str | None = None
    target: str | None = None


EVERY_LETTER = RequeueFilter()


@dataclass(frozen=True)
class RequeueSummary:
    """What a requeue would carry, counted without reading the letters' lines."""

    sink_id: str
    correction: int  # n: the first correction will be epoch -n
    letters: int
    last_id: int  # the newest letter: the batches stop there
    epochs: tuple[int, ...]  # the epochs the letters came from
    stage_letters: int  # rows rejected at staging under the same filter: never requeued
    target: str = ""  # the target that refused them, the only one the corrections go to


@dataclass(frozen=True)
class RequeueSelection:
    """One batch of letters a requeue carries as one correction, in the order they were
    rejected."""

    sink_id: str
    correction: int  # n: the correction will be epoch -n
    ids: tuple[int, ...]
    lines: tuple[str, ...]
    epochs: tuple[int, ...]  # the epochs the letters came from
    target: str = ""  # the target that refused them, the only one the correction goes to

    @property
    def epoch(self) -> int:
        return correction_epoch(self.correction)


def correction_epoch(number: int) -> int:
    """The epoch of the sink's ``number``-th correction."""
    return -number


class Requeuer:
    """One role: turn dead letters into a decided correction. Not idempotent by
    itself -- each call that finds letters makes a new correction -- but a
    letter is requeued at most once (``requeued_in`` is set once, under the
    sink's lock)."""

    def __init__(self, db: Database, stager: Stager) -> None:
        self._db = db
        self._stager = stager

    def summary(self, sink_id: str, chosen: RequeueFilter) -> RequeueSummary:
        """How many letters the filter selects, from which epochs, up to which id, and
        the next correction's number, in one transaction that reads no line;
        StateError when they were refused by several targets (a correction goes to
        one: requeue one target at a time)."""
        params = _params(sink_id, chosen)
        with self._db.transaction() as cur:
            cur.execute(
                "SELECT count(*), coalesce(max(d.id), 0), array_agg(DISTINCT d.epoch),"
                f" array_agg(DISTINCT d.target) {_SELECTED}",
                params | {"phase": Phase.PROMOTE},
            )
            count, last_id, epochs, targets = _one(cur)
            cur.execute(
                f"SELECT count(*) {_SELECTED}", params | {"phase": Phase.STAGE, "target": None}
            )
            (stage,) = _one(cur)
            corrections = self._corrections(cur, sink_id)
        return RequeueSummary(
            sink_id,
            corrections + 1,
            int(count),
            int(last_id),
            tuple(sorted(epochs or ())),
            int(stage),
            _one_target(sink_id, set(targets or ())),
        )

    def select(
        self,
        sink_id: str,
        chosen: RequeueFilter,
        through: int | None = None,
    ) -> RequeueSelection:
        """The next batch of the letters the filter selects (those with an id up to
        ``through``, when given): the oldest not requeued yet, at most
        ``REQUEUE_LETTERS`` and ``REQUEUE_BYTES`` of lines (at least one); empty when
        none is left. StateError when the batch's letters were refused by several
        targets."""
        params = _params(sink_id, chosen) | {
            "phase": Phase.PROMOTE,
            "through": through,
            "letters": REQUEUE_LETTERS,
            "bytes": REQUEUE_BYTES,
        }
        with self._db.transaction() as cur:
            cur.execute(_BATCH, params)
            rows = cur.fetchall()
            corrections = self._corrections(cur, sink_id)
        return RequeueSelection(
            sink_id,
            corrections + 1,
            tuple(r[0] for r in rows),
            tuple(r[1] for r in rows),
            tuple(sorted({r[2] for r in rows})),
            _one_target(sink_id, {r[3] for r in rows}),
        )

    @staticmethod
    def _corrections(cur: Cursor, sink_id: str) -> int:
        cur.execute("SELECT corrections FROM twophase_sinks WHERE sink_id = %s", (sink_id,))
        last = cur.fetchone()
        if last is None:
            raise StateError(f"unknown sink {sink_id!r}")
        return int(last[0])

    def decide(self, lease: Lease, selection: RequeueSelection) -> Decision:
        """Stage the letters' lines and decide them as correction ``-n`` (see the module).

        Raises StateError when another requeue took the correction number or
        one of the letters meanwhile (nothing is then decided), FencedError
        for a stale lease.

        The decision's transaction is repeated while the staging store is
        unreachable (the staging before it rides out an outage by itself). A
        repeat reads back first: the correction already recorded with exactly
        the write this call staged was decided by an earlier attempt whose
        commit landed before the connection dropped; it is returned, not
        refused as another requeue's.
        """
        if not selection.ids:
            raise StateError(f"sink {lease.sink_id!r}: no dead letters to requeue")
        message = self._stager.stage(
            lease.sink_id, selection.epoch, selection.lines, run_id=lease.run_id
        )

        def attempt(read_back: bool) -> Decision:
            return self._decide(lease, selection, message, read_back)

        decision = self._db.retry("requeue", lambda: attempt(False), again=lambda: attempt(True))
        crash_point("after_decide", lease.sink_id)
        return decision

    def _decide(
        self,
        lease: Lease,
        selection: RequeueSelection,
        message: CommitMessage,
        read_back: bool,
    ) -> Decision:
        epoch = selection.epoch
        with self._db.transaction() as cur:
            sink = lock_sink(cur, lease.sink_id)
            check_fence(sink, lease)
            decision = (
                read_back and own_decision(cur, lease.sink_id, epoch, [message.write_id])
            ) or _record_correction(cur, lease, sink, selection, message)
            crash_point("in_requeue", lease.sink_id)
            return decision


def _record_correction(
    cur: Cursor,
    lease: Lease,
    sink: dict[str, Any],
    selection: RequeueSelection,
    message: CommitMessage,
) -> Decision:
    """Record correction ``-n`` PRECOMMITTED with the staged write, its letters requeued
    in it, and count it (inside the caller's transaction, under the sink's lock)."""
    if sink["corrections"] != selection.correction - 1:
        raise StateError(f"sink {lease.sink_id!r}: another requeue ran meanwhile")
    epoch = selection.epoch
    _mark_requeued(cur, lease.sink_id, epoch, selection.ids)
    froms = ", ".join(map(str, selection.epochs))
    write = (uuid.UUID(message.write_id), message.points, 0, message.checksum)
    decision = insert_decision(cur, lease, epoch, [write], f"; requeued from {froms}")
    if selection.target:  # several targets: the correction is for the one that refused
        cur.execute(
            "UPDATE twophase_epochs SET target = %s WHERE sink_id = %s AND epoch = %s",
            (selection.target, lease.sink_id, epoch),
        )
    cur.execute(
        "UPDATE twophase_sinks SET corrections = %s, points_requeued = points_requeued"
        " + %s WHERE sink_id = %s",
        (selection.correction, len(selection.ids), lease.sink_id),
    )
    detail = f"{len(selection.ids)} dead letters of epochs {froms}"
    event(cur, lease.sink_id, epoch, "requeued", lease.run_id, detail)
    return decision


# One batch: the oldest letters selected (up to an id), at most %(letters)s of them and
# %(bytes)s bytes of lines, the first whatever its size. The window sums the sizes of
# the batch's candidates only (the inner LIMIT), along the primary key's order.
_BATCH = (
    "SELECT id, payload, epoch, target"  # noqa: S608 - constant fragments, values parameters
    " FROM (SELECT id, payload, epoch, target,"
    " sum(octet_length(payload)) OVER (ORDER BY id) - octet_length(payload) AS before"
    " FROM (SELECT d.id, d.payload, d.epoch, d.target"
    f" {_SELECTED} AND (%(through)s::bigint IS NULL OR d.id <= %(through)s)"
    " ORDER BY d.id LIMIT %(letters)s) AS candidates) AS sized"
    " WHERE before = 0 OR before + octet_length(payload) <= %(bytes)s ORDER BY id"
)


def _params(sink_id: str, chosen: RequeueFilter) -> dict[str, Any]:
    return {
        "sink": sink_id,
        "epoch": chosen.epoch,
        "reason": chosen.reason,
        "target": chosen.target,
    }


def _one(cur: Cursor) -> tuple[Any, ...]:
    row = cur.fetchone()
    assert row is not None  # an aggregate's one row
    return tuple(row)


def _one_target(sink_id: str, targets: set[str]) -> str:
    if len(targets) > 1:
        named = ", ".join(sorted(t or "(the sink's one)" for t in targets))
        raise StateError(
            f"sink {sink_id!r}: the dead letters selected were refused by several targets "
            f"({named}); a correction goes to one: requeue with --target NAME for each"
        )
    return next(iter(targets), "")


def _mark_requeued(cur: Cursor, sink_id: str, epoch: int, ids: tuple[int, ...]) -> None:
    cur.execute(
        "UPDATE twophase_dead_letters SET requeued_in = %s, requeued_at = now()"
        " WHERE id = ANY(%s) AND requeued_in IS NULL",
        (epoch, list(ids)),
    )
    if cur.rowcount != len(ids):
        raise StateError(f"sink {sink_id!r}: some dead letters were requeued meanwhile")
