"""Removing a target from its sink: the decommission of a server.

A target stays registered for its sink after the configuration stops naming it (only a
query's run registers targets, and nothing unregisters one), and a registered target
holds the sink's history: compaction's floor
([`twophase.protocol.maintain.compaction`][twophase.protocol.maintain.compaction]) stays below its
cursor, quarantined or not, its dead letters keep their epochs' records, and its delivery rows
are never compacted. [`TargetRemoval.remove`][twophase.operations.decommission.TargetRemoval.remove]
deletes, in one transaction:

* its row of ``twophase_targets`` (its cursor, state and lag clock), and so its backlog
  (the view ``twophase_target_backlog`` reads the row): the COMMITTED epochs and
  corrections it lacked are no longer owed to anyone;
* its deliveries (``twophase_target_deliveries``);
* the dead letters it refused (``twophase_dead_letters.target``), those a reset kept
  too: they could only be requeued to it;
* the corrections owed to it alone (``twophase_epochs.target``, any state), with their
  writes, staged chunks and history; their staged bytes come off the sink's total;

and records the event ``target_removed`` in the sink's history. Stage-time letters and
corrections owed to every target are the sink's and stay.

It runs under the target's advisory lock (the catch-up's: a catch-up delivering to it
finishes its epoch first, and none starts meanwhile), then the sink's row lock, as
decide and the mark take it (a commit records its deliveries under it), then the rows of
the sink's targets. A run that still delivers to the target afterwards records nothing
for it: recording a delivery to a target without a row is refused
(``TargetOrderError``), and a commit leaves such a target out while enough others hold
the epoch. A query's next claim registers a target of that name again, as a new one
from the sink's next epoch.

The sink's last target is never removed: its epochs would be delivered to no one.
"""

from __future__ import annotations

from dataclasses import dataclass

from twophase.errors import StateError
from twophase.faults import crash_point
from twophase.protocol.commit.catchup import target_lock
from twophase.protocol.ledger.transitions import Cursor, event, lock_sink
from twophase.store.database import Database
from twophase.store.locks import LockOwner

__all__ = ["Removal", "TargetRemoval"]


@dataclass(frozen=True)
class Removal:
    """A target's removal: what it held and owed, and what goes with it (or, previewed,
    would go)."""

    sink_id: str
    target: str
    state: str  # live, lagging or quarantined, when removed
    delivered_epoch: int | None
    backlog_epochs: int  # COMMITTED Spark epochs it lacked: never delivered to it now
    backlog_corrections: int  # corrections it lacked
    backlog_bytes: int  # their staged bytes
    deliveries: int  # its delivery rows
    dead_letters: int  # the letters it refused
    corrections: tuple[int, ...]  # the corrections owed to it alone (-1, -2, ...)
    remaining: tuple[str, ...]  # the sink's targets after it


_ROWS = (
    "SELECT target, state, delivered_epoch FROM twophase_targets WHERE sink_id = %s ORDER BY target"
)
_ROWS_LOCKED = f"{_ROWS} FOR UPDATE"
# The target's backlog and what is recorded for it, in one statement.
_COUNTS = (
    "SELECT (SELECT count(*) FILTER (WHERE epoch >= 0) FROM twophase_target_backlog"
    " WHERE sink_id = %(s)s AND target = %(t)s),"
    " (SELECT count(*) FILTER (WHERE epoch < 0) FROM twophase_target_backlog"
    " WHERE sink_id = %(s)s AND target = %(t)s),"
    " (SELECT COALESCE(sum(staged_bytes), 0) FROM twophase_target_backlog"
    " WHERE sink_id = %(s)s AND target = %(t)s),"
    " (SELECT count(*) FROM twophase_target_deliveries WHERE sink_id = %(s)s"
    " AND target = %(t)s),"
    " (SELECT count(*) FROM twophase_dead_letters WHERE sink_id = %(s)s AND target = %(t)s),"
    " (SELECT array_agg(epoch ORDER BY epoch DESC) FROM twophase_epochs"
    " WHERE sink_id = %(s)s AND epoch < 0 AND target = %(t)s)"
)
# Everything of the target in one statement (every part runs, referenced or not): the
# corrections owed to it alone with their writes, chunks and history, its deliveries and
# letters, its row; the corrections' retained bytes taken off the sink's total.
_REMOVE = (
    "WITH c AS (DELETE FROM twophase_epochs WHERE sink_id = %(s)s AND epoch < 0"
    " AND target = %(t)s RETURNING epoch, staged_bytes),"
    " w AS (DELETE FROM twophase_writes WHERE sink_id = %(s)s"
    " AND epoch IN (SELECT epoch FROM c) RETURNING write_id),"
    " ch AS (DELETE FROM twophase_staged_chunks WHERE write_id IN (SELECT write_id FROM w)),"
    " h AS (DELETE FROM twophase_epoch_events WHERE sink_id = %(s)s"
    " AND epoch IN (SELECT epoch FROM c)),"
    " d AS (DELETE FROM twophase_target_deliveries WHERE sink_id = %(s)s AND target = %(t)s),"
    " l AS (DELETE FROM twophase_dead_letters WHERE sink_id = %(s)s AND target = %(t)s),"
    " t AS (DELETE FROM twophase_targets WHERE sink_id = %(s)s AND target = %(t)s)"
    " UPDATE twophase_sinks SET updated_at = now(), staged_bytes = GREATEST(staged_bytes"
    " - (SELECT COALESCE(sum(staged_bytes), 0) FROM c), 0) WHERE sink_id = %(s)s"
)


class TargetRemoval:
    """One role: remove a target from its sink, with what is owed to it alone."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def preview(self, sink_id: str, target: str) -> Removal:
        """What removing ``target`` would delete, read without a lock; StateError when the
        sink has no such target or it is the sink's last."""
        with self._db.transaction() as cur:
            return _removal(cur, sink_id, target, lock=False)

    def remove(self, sink_id: str, target: str, actor: str) -> Removal:
        """Remove ``target`` from the sink (see the module), all or nothing; what it
        deleted. StateError, nothing changed, when the sink has no such target (any
        more) or it is the sink's last."""
        token = self._token(sink_id)
        # The catch-up's lock first, as a catch-up takes it before its transaction: a
        # delivery to the target under way ends before the rows go.
        lock = self._db.session_lock(target_lock(sink_id, target), LockOwner(sink_id, token))
        with lock, self._db.transaction() as cur:
            lock_sink(cur, sink_id)
            done = _removal(cur, sink_id, target, lock=True)
            cur.execute(_REMOVE, {"s": sink_id, "t": target})
            event(cur, sink_id, None, "target_removed", actor, _detail(done))
            crash_point("in_remove", sink_id)
            return done

    def _token(self, sink_id: str) -> int:
        """The sink's fencing token: the lock is taken as its current run's (a fenced
        run's holder of it is ended, a live one's waited for)."""
        with self._db.transaction() as cur:
            cur.execute("SELECT fencing_token FROM twophase_sinks WHERE sink_id = %s", (sink_id,))
            row = cur.fetchone()
        if row is None:
            raise StateError(f"unknown sink {sink_id!r}")
        return int(row[0])


def _removal(cur: Cursor, sink_id: str, target: str, *, lock: bool) -> Removal:
    """The target's standing and what is recorded for it; the sink's targets' rows held
    FOR UPDATE with ``lock``."""
    cur.execute(_ROWS_LOCKED if lock else _ROWS, (sink_id,))
    rows = {name: (state, cursor) for name, state, cursor in cur.fetchall()}
    _check(sink_id, target, list(rows))
    cur.execute(_COUNTS, {"s": sink_id, "t": target})
    found = cur.fetchone()
    assert found is not None  # sub-selects: one row
    epochs, corrections, size, deliveries, letters, owed = found
    state, cursor = rows[target]
    return Removal(
        sink_id,
        target,
        state,
        cursor,
        int(epochs),
        int(corrections),
        int(size),
        int(deliveries),
        int(letters),
        tuple(owed or ()),
        tuple(name for name in rows if name != target),
    )


def _check(sink_id: str, target: str, names: list[str]) -> None:
    if target not in names:
        has = f"its targets: {', '.join(names)}" if names else "it has none"
        raise StateError(f"sink {sink_id!r} has no target {target!r} ({has})")
    if len(names) == 1:
        raise StateError(
            f"target {target!r} is the last target of sink {sink_id!r}: a sink delivers to "
            "at least one. Run the sink's query with the target that replaces it first (its "
            "claim registers it), then remove this one; nothing was removed"
        )


def _detail(done: Removal) -> str:
    """The event's detail: what went with the target."""
    corrections = ", ".join(f"c{-e}" for e in done.corrections) or "none"
    return (
        f"{done.target}: was {done.state} at {done.delivered_epoch}; lacked "
        f"{done.backlog_epochs} epochs and {done.backlog_corrections} corrections; removed "
        f"{done.deliveries} deliveries, {done.dead_letters} dead letters, corrections "
        f"owed to it alone: {corrections}"
    )
