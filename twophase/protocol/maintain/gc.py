"""Garbage collection of the staging store: retention of committed epochs, orphaned writes.

* Staged points of COMMITTED or ABORTED epochs are kept ``retention`` after
  the epoch ended (so they can be re-sent, e.g. after a target is restored from a backup),
  then deleted; the epoch keeps its row and is marked ``purged_at``.
* With several targets, a COMMITTED epoch's points are kept, past retention too, until every
  target that is not quarantined holds it (each target's backlog,
  [`twophase.protocol.ledger.target_ledger`][twophase.protocol.ledger.target_ledger]); a collection
  first quarantines the targets behind by more than ``target_max_lag``, or whose backlog holds more
  than ``target_max_backlog_bytes`` staged bytes, logging each with the bound it passed, so
  that a dead target holds staging only so long, and only so much.
* A write no decision names is an orphan (a failed, speculative or replayed
  task attempt). It is removed once its epoch is decided, or after
  ``orphan_grace`` if its epoch never is (a run that crashed before voting),
  with its staged lines and its dead letters -- except those a reset kept:
  a reset forgets the epochs, which makes every write an orphan, but the
  dead letters of the writes they had chosen stay the sink's.
* An epoch's record (its row, writes, history, deliveries) is kept
  ``history_retention`` after it ended, then compacted into the sink's floor
  once every target holds it
  ([`twophase.protocol.maintain.compaction`][twophase.protocol.maintain.compaction]):
  the history of a sink stops growing (once the targets its configuration no
  longer names are removed: [`twophase.operations.decommission`][twophase.operations.decommission]),
  and a replay of a compacted epoch is still told (I4).

Every age is measured by the database's clock (the cut-offs are read from its
``now()``, the clock that stamped the epochs and writes), never by the
calling host's. A ``limit`` bounds one collection's work (the committer's
automatic collections, [`twophase.protocol.maintain.autogc`][twophase.protocol.maintain.autogc]): at
most that many epochs purged, orphaned writes removed, and epochs compacted; what is left waits
for the next.

Idempotent and safe to run at any time, also while a query runs: it locks
the sink rows before deleting writes, as decide does, so it never removes a
write that a concurrent decision chooses (I1).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from twophase.faults import crash_point
from twophase.logs import fields
from twophase.model import EpochState
from twophase.protocol.ledger.target_ledger import Quarantine, TargetLedger
from twophase.protocol.maintain.compaction import compact_batch
from twophase.store.database import Database

log = logging.getLogger("twophase.protocol.gc")
Cursor = psycopg.Cursor[Any]


@dataclass(frozen=True)
class GcReport:
    """What one collection removed (or, dry, would remove); ``sink_id`` None: all sinks."""

    sink_id: str | None
    epochs_purged: int
    points_purged: int
    orphan_writes: int
    dry_run: bool
    quarantined: tuple[tuple[str, str], ...] = ()  # (sink, target) newly quarantined
    # records deleted into the floor (twophase.protocol.maintain.compaction)
    epochs_compacted: int = 0
    compacted_through: int | None = None  # the sink's floor after it (one sink collected)
    # the bound each of ``quarantined`` passed, in the same order
    quarantine_reasons: tuple[str, ...] = ()


class GarbageCollector:
    """One role: delete what no longer needs keeping. ``collect`` and ``discard``
    are idempotent."""

    def __init__(
        self,
        db: Database,
        retention_s: float,
        orphan_grace_s: float,
        chunk: int = 200,
        *,
        max_lag_s: float | None = None,
        max_backlog_bytes: int = 0,
        history_s: float | None = None,
    ):
        self._db = db
        self._retention_s = retention_s
        self._grace_s = orphan_grace_s
        self._chunk = chunk
        self._max_lag_s = max_lag_s  # target_max_lag (None: no quarantine here)
        self._max_bytes = max_backlog_bytes  # target_max_backlog_bytes (0: no such bound)
        self._history_s = history_s  # history_retention (None: no compaction here)

    def collect(
        self,
        sink_id: str | None = None,
        dry_run: bool = False,
        *,
        limit: int | None = None,
        ahead_s: float = 0.0,
    ) -> GcReport:
        """Remove expired staged points and orphaned writes (of one sink, or all), then
        compact the records of epochs past ``history_retention``.

        ``limit``: at most that many epochs purged, orphaned writes removed and
        epoch records compacted (None: all). ``ahead_s``: collect as the database's
        clock will see it that many seconds from now (tests, benchmarks).
        """
        quarantined = () if dry_run else self._quarantine(sink_id)
        expired_before, staged_before, history_before = self._cutoffs(ahead_s)
        epochs, points = self._purge_expired(sink_id, expired_before, dry_run, limit)
        orphans = self._remove_orphans(sink_id, staged_before, dry_run, limit)
        compacted, floor = self._compact(sink_id, history_before, dry_run, limit)
        return GcReport(
            sink_id,
            epochs,
            points,
            orphans,
            dry_run,
            tuple((q.sink_id, q.target) for q in quarantined),
            compacted,
            floor,
            tuple(q.reason for q in quarantined),
        )

    def _quarantine(self, sink_id: str | None) -> tuple[Quarantine, ...]:
        """Quarantine the targets behind by more than ``target_max_lag``, or by more than
        ``target_max_backlog_bytes``: they stop holding retention. Never silent: a
        warning and an event each, naming the bound."""
        if self._max_lag_s is None:
            return ()
        ledger = TargetLedger(self._db)
        done = tuple(ledger.quarantine(sink_id, self._max_lag_s, self._max_bytes))
        for each in done:
            log.warning(
                "sink %s: target %s is quarantined, %s: staging no longer keeps its "
                "backlog; `twophase targets resync %s --sink %s` re-delivers what is retained",
                each.sink_id,
                each.target,
                each.reason,
                each.target,
                each.sink_id,
                extra=fields(each.sink_id),
            )
        return done

    def _cutoffs(self, ahead_s: float) -> tuple[datetime, datetime, datetime]:
        """Ended before the first, an epoch is past retention; staged before the second,
        an undecided write is past its grace; ended before the third, an epoch's record
        is past history_retention. Read once per collection from the clock that stamped
        them: a host's clock running ahead must not purge early."""
        history_s = 0.0 if self._history_s is None else self._history_s
        with self._db.transaction() as cur:
            cur.execute(
                "SELECT t - make_interval(secs => %s), t - make_interval(secs => %s),"
                " t - make_interval(secs => %s)"
                " FROM (SELECT now() + make_interval(secs => %s) AS t) clock",
                (self._retention_s, self._grace_s, history_s, ahead_s),
            )
            expired_before, staged_before, history_before = cur.fetchone()  # type: ignore[misc]
        return expired_before, staged_before, history_before

    def _compact(
        self, sink_id: str | None, before: datetime, dry_run: bool, limit: int | None
    ) -> tuple[int, int | None]:
        """Compact the sinks' old records, a batch per transaction; the records deleted
        and (one sink) its floor after it."""
        if self._history_s is None:
            return 0, None
        done, floor = 0, None
        for sink in [sink_id] if sink_id is not None else self._sink_ids():
            while limit is None or done < limit:
                with self._db.transaction() as cur:
                    take = _take(self._chunk, limit, done, dry_run)
                    gone, floor, more = compact_batch(cur, sink, before, take, dry_run)
                done += gone
                if not more or dry_run:
                    break
        return done, floor if sink_id is not None else None

    def _sink_ids(self) -> list[str]:
        with self._db.transaction() as cur:
            cur.execute("SELECT sink_id FROM twophase_sinks ORDER BY sink_id")
            return [row[0] for row in cur.fetchall()]

    def discard(self, write_ids: Sequence[str]) -> int:
        """Delete writes that no decided epoch names, now (a Spark replay's new attempt,
        Spark's ``abort``). A write chosen by a decision is never touched (I1).
        Returns how many writes were removed.
        """
        ids = [uuid.UUID(w) for w in write_ids]
        if not ids:
            return 0

        def discard() -> int:
            with self._db.transaction() as cur:
                _lock_sinks_of_writes(cur, ids)
                gone = len(_delete_unchosen_writes(cur, ids))
                crash_point("in_discard")
                return gone

        return self._db.retry("discard", discard)

    def _purge_expired(
        self, sink_id: str | None, before: datetime, dry_run: bool, limit: int | None
    ) -> tuple[int, int]:
        epochs = points = 0
        while limit is None or epochs < limit:
            with self._db.transaction() as cur:
                take = _take(self._chunk, limit, epochs, dry_run)
                expired = _expired_epochs(cur, sink_id, before, take)
                if not expired:
                    return epochs, points
                write_ids = [w for _, _, ids in expired for w in ids]
                points += _delete_points(cur, write_ids, dry_run)
                epochs += len(expired)
                if dry_run:
                    return epochs, points
                cur.execute(_MARK_PURGED, ([s for s, _, _ in expired], [e for _, e, _ in expired]))
                crash_point("in_gc", sink_id)
        return epochs, points

    def _remove_orphans(
        self, sink_id: str | None, staged_before: datetime, dry_run: bool, limit: int | None
    ) -> int:
        removed = 0
        while limit is None or removed < limit:
            with self._db.transaction() as cur:
                take = _take(self._chunk, limit, removed, dry_run)
                ids = _orphan_writes(cur, sink_id, staged_before, take)
                if not ids or dry_run:
                    return removed + len(ids)
                _lock_sinks_of_writes(cur, ids)
                gone = _delete_unchosen_writes(cur, ids)
                crash_point("in_gc", sink_id)
                removed += len(gone)
                if len(gone) < len(ids):  # a decision chose some meanwhile: nothing more here
                    return removed
        return removed


def _take(chunk: int, limit: int | None, done: int, dry_run: bool) -> int | None:
    """Rows for the next transaction: a chunk, no more than the limit leaves."""
    left = None if limit is None else limit - done
    if dry_run:
        return left  # a dry run counts all it may remove at once (None: LIMIT NULL)
    return chunk if left is None else min(chunk, left)


def _expired_epochs(
    cur: Cursor, sink_id: str | None, before: datetime, limit: int | None
) -> list[tuple[str, int, list[Any]]]:
    cur.execute(
        "SELECT sink_id, epoch, write_ids FROM twophase_epochs"
        " WHERE state = ANY(%s) AND purged_at IS NULL"
        " AND COALESCE(committed_at, aborted_at) < %s"
        " AND (%s::text IS NULL OR sink_id = %s)"
        # held for a target that lacks it and is not quarantined
        # (twophase.protocol.ledger.target_ledger)
        " AND NOT EXISTS (SELECT 1 FROM twophase_target_backlog b JOIN twophase_targets t"
        " ON t.sink_id = b.sink_id AND t.target = b.target WHERE t.state <> 'quarantined'"
        " AND b.sink_id = twophase_epochs.sink_id AND b.epoch = twophase_epochs.epoch)"
        " ORDER BY sink_id, epoch LIMIT %s FOR UPDATE SKIP LOCKED",
        ([EpochState.COMMITTED, EpochState.ABORTED], before, sink_id, sink_id, limit),
    )
    return [(s, e, list(ids)) for s, e, ids in cur.fetchall()]


# Marks epochs purged and takes their bytes off their sinks' retained total.
_MARK_PURGED = (
    "WITH purged AS (UPDATE twophase_epochs SET purged_at = now(), staged_bytes = 0"
    " FROM (SELECT sink_id AS s, epoch AS e, staged_bytes AS b FROM twophase_epochs"
    " WHERE (sink_id, epoch) IN (SELECT * FROM unnest(%s::text[], %s::bigint[]))) old"
    " WHERE sink_id = old.s AND epoch = old.e RETURNING old.s, old.b)"
    " UPDATE twophase_sinks SET staged_bytes = GREATEST(staged_bytes - g.b, 0)"
    " FROM (SELECT s, sum(b) AS b FROM purged GROUP BY s) g WHERE sink_id = g.s"
)

_COUNT_POINTS = (
    "SELECT COALESCE(sum(points), 0) FROM twophase_staged_chunks WHERE write_id = ANY(%s)"
)
_DELETE_POINTS = (
    "WITH gone AS (DELETE FROM twophase_staged_chunks WHERE write_id = ANY(%s)"
    " RETURNING points) SELECT COALESCE(sum(points), 0) FROM gone"
)


def _delete_points(cur: Cursor, write_ids: list[Any], dry_run: bool) -> int:
    """Delete (or, dry, count) the staged points of these writes; how many."""
    cur.execute(_COUNT_POINTS if dry_run else _DELETE_POINTS, (write_ids,))
    row = cur.fetchone()
    return int(row[0]) if row else 0


def _orphan_writes(
    cur: Cursor, sink_id: str | None, staged_before: datetime, limit: int | None
) -> list[Any]:
    cur.execute(
        "SELECT w.write_id FROM twophase_writes w"
        " LEFT JOIN twophase_epochs e ON e.sink_id = w.sink_id AND e.epoch = w.epoch"
        " WHERE (%s::text IS NULL OR w.sink_id = %s)"
        " AND ((e.epoch IS NOT NULL AND NOT (w.write_id = ANY(e.write_ids)))"
        "      OR (e.epoch IS NULL AND w.staged_at < %s))"
        " ORDER BY w.write_id LIMIT %s",
        (sink_id, sink_id, staged_before, limit),
    )
    return [row[0] for row in cur.fetchall()]


def _lock_sinks_of_writes(cur: Cursor, ids: list[uuid.UUID]) -> None:
    """Lock the sink rows of these writes, as decide() does, so that a concurrent
    decision cannot choose a write while it is being deleted."""
    cur.execute(
        "SELECT sink_id FROM twophase_sinks WHERE sink_id IN (SELECT DISTINCT sink_id"
        " FROM twophase_writes WHERE write_id = ANY(%s)) ORDER BY sink_id FOR UPDATE",
        (ids,),
    )


def _delete_unchosen_writes(cur: Cursor, ids: list[uuid.UUID]) -> list[uuid.UUID]:
    """Remove the given writes, their lines and dead letters, unless a decision names them.
    A dead letter a reset kept (``reset_at``: its write was chosen before the reset
    forgot the epoch) stays: it is the sink's, not the orphan's."""
    cur.execute(
        "DELETE FROM twophase_writes w WHERE w.write_id = ANY(%s) AND NOT EXISTS ("
        " SELECT 1 FROM twophase_epochs e WHERE e.sink_id = w.sink_id AND e.epoch = w.epoch"
        " AND w.write_id = ANY(e.write_ids)) RETURNING w.write_id",
        (ids,),
    )
    gone = [row[0] for row in cur.fetchall()]
    if gone:
        cur.execute("DELETE FROM twophase_staged_chunks WHERE write_id = ANY(%s)", (gone,))
        cur.execute(
            "DELETE FROM twophase_dead_letters WHERE write_id = ANY(%s) AND reset_at IS NULL",
            (gone,),
        )
    return gone
