"""Compaction of a sink's epoch history: old records deleted, a floor kept in their stead.

Without it every epoch keeps its record for ever, long after GC purged its
points: its row in ``twophase_epochs``, its writes' rows, its history
(``twophase_epoch_events``) and a delivery row per target
(``twophase_target_deliveries``). A collection compacts, per sink and in epoch
order, the oldest epochs whose record nothing needs any more, and raises the
sink's floor (``twophase_sinks.compacted_through``) past them: a Spark epoch
up to the floor that has no record was COMMITTED and delivered to every
target (or never decided: a batch without tasks, whose number Spark skips
again on a replay).

The floor passes an epoch that

* is COMMITTED (or ABORTED, whose record stays: an operator's few decisions),
* had its points purged and ended more than ``history_retention`` ago,
* every target of the sink holds (its cursor at or past it: a lagging or
  quarantined target holds the floor back until it is caught up or resynced;
  one the configuration no longer names, until an operator removes it,
  [`twophase.operations.decommission`][twophase.operations.decommission]),
* is below the sink's last COMMITTED Spark epoch (that record stays: a target
  added later starts after it, and nothing below it can be owed to one).

The first epoch that does not stops it (a PRECOMMITTED one, a young one). A
passed epoch that a dead letter names keeps its record too (listing, counting
and requeueing its letters read the writes it chose). Corrections (negative
epochs) are never compacted.

What the floor keeps true: decide takes an epoch at or below it without a
record for a replay of a COMMITTED epoch and skips it (I4,
[`twophase.protocol.ledger.epoch_ledger`][twophase.protocol.ledger.epoch_ledger]); a reset
checkpoint is refused as before, by the query and the last decided epoch on the sink's row, which
compaction leaves alone (I6), and a reset clears the floor with the epochs; no
target's cursor or backlog refers to a compacted epoch (I9).

Each batch is one transaction under the sink's row lock, as decide takes it: a
replay is decided against the records and the floor of one moment.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg

from twophase.faults import crash_point
from twophase.model import EpochState

Cursor = psycopg.Cursor[Any]
# (epoch, state, old: purged and ended before the cut-off, named by a dead letter)
Candidate = tuple[int, str, bool, bool]

# The sink's floor, and the highest epoch it may reach now: below the last COMMITTED
# Spark epoch, and no higher than any target's cursor (a target not yet past its
# from_epoch holds everything below it). The sink's row locked, as decide locks it.
_BOUNDS = (
    "SELECT s.compacted_through, CASE WHEN last.epoch IS NOT NULL"
    " THEN LEAST(last.epoch - 1, held.epoch) END FROM twophase_sinks s,"
    " (SELECT max(epoch) AS epoch FROM twophase_epochs WHERE sink_id = %(s)s AND epoch >= 0"
    " AND state = 'COMMITTED') last,"
    " (SELECT min(GREATEST(COALESCE(delivered_epoch, -1), from_epoch - 1)) AS epoch"
    " FROM twophase_targets WHERE sink_id = %(s)s) held"
    " WHERE s.sink_id = %(s)s FOR UPDATE OF s"
)
# The next epochs above the floor, oldest first: an index range of the primary key.
_CANDIDATES = (
    "SELECT e.epoch, e.state, e.purged_at IS NOT NULL"
    " AND COALESCE(e.committed_at, e.aborted_at) < %(before)s,"
    " EXISTS (SELECT 1 FROM twophase_dead_letters d WHERE d.sink_id = e.sink_id"
    " AND d.epoch = e.epoch) FROM twophase_epochs e WHERE e.sink_id = %(s)s"
    " AND e.epoch > %(floor)s AND e.epoch <= %(upper)s ORDER BY e.epoch LIMIT %(take)s"
)
# The records of the epochs, and the floor raised, in one statement (every part runs,
# referenced or not). Each delete is an index lookup per epoch; a chosen write's
# chunks are purged already, an orphan's go with it.
_COMPACT = (
    "WITH e AS (DELETE FROM twophase_epochs WHERE sink_id = %(s)s AND epoch = ANY(%(e)s)"
    " AND state = 'COMMITTED'),"
    " w AS (DELETE FROM twophase_writes WHERE sink_id = %(s)s AND epoch = ANY(%(e)s)"
    " RETURNING write_id),"
    " c AS (DELETE FROM twophase_staged_chunks WHERE write_id IN (SELECT write_id FROM w)),"
    " h AS (DELETE FROM twophase_epoch_events WHERE sink_id = %(s)s AND epoch = ANY(%(e)s)),"
    " d AS (DELETE FROM twophase_target_deliveries d USING twophase_targets t,"
    " unnest(%(e)s::bigint[]) AS n(epoch) WHERE t.sink_id = %(s)s AND d.sink_id = t.sink_id"
    " AND d.target = t.target AND d.epoch = n.epoch)"
    " UPDATE twophase_sinks SET compacted_through = %(f)s WHERE sink_id = %(s)s"
)


def compact_batch(
    cur: Cursor, sink_id: str, before: datetime, take: int | None, dry_run: bool
) -> tuple[int, int | None, bool]:
    """One batch of a sink's compaction, in the caller's transaction: at most ``take``
    epochs passed (None: all there are). Returns the records deleted (dry: that would
    be), the floor after it (None: none), and whether it stopped at ``take`` (more may
    follow)."""
    cur.execute(_BOUNDS, {"s": sink_id})
    row = cur.fetchone()
    if row is None:
        return 0, None, False
    floor, upper = row
    if upper is None or (floor is not None and upper <= floor):
        return 0, floor, False
    since = -1 if floor is None else floor
    cur.execute(
        _CANDIDATES, {"s": sink_id, "floor": since, "upper": upper, "before": before, "take": take}
    )
    rows: list[Candidate] = cur.fetchall()
    gone, passed = _passable(rows)
    if passed is None:
        return 0, floor, False
    if not dry_run:
        cur.execute(_COMPACT, {"s": sink_id, "e": gone, "f": passed})
        crash_point("in_gc", sink_id)
    full = take is not None and len(rows) == take and passed == rows[-1][0]
    return len(gone), passed, full


def _passable(rows: Sequence[Candidate]) -> tuple[list[int], int | None]:
    """The epochs whose records go, and the floor past the longest run of epochs, from
    the first, that the floor may pass (None: not even the first)."""
    gone: list[int] = []
    passed = None
    for epoch, state, old, lettered in rows:
        if not old or state not in (EpochState.COMMITTED, EpochState.ABORTED):
            break
        if state == EpochState.COMMITTED and not lettered:
            gone.append(epoch)
        passed = epoch
    return gone, passed
