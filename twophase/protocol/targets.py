"""Per-target delivery state: which epochs each named InfluxDB target of a sink holds.

A sink with several targets (``targets``) decides each epoch once (I1) and
then delivers it to each target **in epoch order**. Per target the store
keeps a cursor, ``delivered_epoch``: every COMMITTED epoch of the sink from
the target's ``from_epoch`` up to the cursor is in the target (I9: per
target, the delivered epochs are a prefix of the COMMITTED ones). A
promotion delivers epoch N only to a target that is *caught up* (the cursor
holds every COMMITTED epoch below N), so a lagging target never receives
N+1 before N; the catch-up worker ([`twophase.protocol.catchup`][twophase.protocol.catchup]) moves
a lagging cursor on, one COMMITTED epoch at a time.

    live --a commit gave up on it--> lagging --caught up--> live
      lagging --behind longer than target_max_lag--> quarantined --resync--> live

Every method is one transaction, safe to repeat (``Database.retry``): a
delivery is recorded once per target and epoch, and recording it again
changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from twophase.faults import crash_point
from twophase.protocol.transitions import Cursor, event
from twophase.store.database import Database

__all__ = ["LAGGING", "LIVE", "QUARANTINED", "Place", "TargetLedger", "TargetState"]

LIVE, LAGGING, QUARANTINED = "live", "lagging", "quarantined"


@dataclass(frozen=True)
class Place:
    """Where a target stands for one epoch's promotion."""

    target: str
    owed: bool  # the epoch is one the target must get (not before its from_epoch)
    has: tuple[int, int] | None  # (delivered, rejected) once it got the epoch
    caught_up: bool  # it holds every COMMITTED epoch it is owed below this one


@dataclass(frozen=True)
class TargetState:
    """One target of a sink, as ``twophase status`` shows it."""

    sink_id: str
    target: str
    state: str
    delivered_epoch: int | None
    from_epoch: int
    lag_epochs: int  # COMMITTED epochs it is owed and does not hold
    lag_seconds: float | None  # age of the oldest of them (since its commit)
    lag_bytes: int  # their staged bytes
    first_missing: int | None  # the oldest of them
    lagging_since: datetime | None
    quarantined_at: datetime | None
    last_error: str | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "state": self.state,
            "delivered_epoch": self.delivered_epoch,
            "from_epoch": self.from_epoch,
            "lag_epochs": self.lag_epochs,
            "lag_seconds": self.lag_seconds,
            "lag_bytes": self.lag_bytes,
            "first_missing": self.first_missing,
            "lagging_since": _iso(self.lagging_since),
            "quarantined_at": _iso(self.quarantined_at),
            "last_error": self.last_error,
        }


# The view twophase_target_backlog (migration 0007) is each target's backlog: the
# COMMITTED epochs it is owed past its cursor.
# A correction (epoch < 0) is owed to the target it names (every target: none named).
_PLACES = (
    "SELECT t.target, CASE WHEN %(e)s < 0 THEN ep.target IS NULL OR ep.target = t.target"
    " ELSE %(e)s >= t.from_epoch END, d.delivered, d.rejected,"
    " CASE WHEN %(e)s < 0 THEN t.state <> 'quarantined' ELSE NOT EXISTS (SELECT 1"
    " FROM twophase_target_backlog b WHERE b.sink_id = t.sink_id AND b.target = t.target"
    " AND b.epoch < %(e)s) END"
    " FROM twophase_targets t LEFT JOIN twophase_target_deliveries d"
    " ON d.sink_id = t.sink_id AND d.target = t.target AND d.epoch = %(e)s"
    " LEFT JOIN twophase_epochs ep ON ep.sink_id = t.sink_id AND ep.epoch = %(e)s"
    " WHERE t.sink_id = %(s)s AND t.target = ANY(%(n)s) ORDER BY t.target"
)
_STATES = (
    "SELECT t.sink_id, t.target, t.state, t.delivered_epoch, t.from_epoch, count(b.epoch),"
    " EXTRACT(EPOCH FROM now() - min(b.committed_at)), COALESCE(sum(b.staged_bytes), 0),"
    " min(b.epoch), t.lagging_since, t.quarantined_at, t.last_error"
    " FROM twophase_targets t LEFT JOIN twophase_target_backlog b"
    " ON b.sink_id = t.sink_id AND b.target = t.target"
    " WHERE (%(s)s::text IS NULL OR t.sink_id = %(s)s)"
    " GROUP BY t.sink_id, t.target ORDER BY t.sink_id, t.target"
)
# A new target starts after the sink's last COMMITTED epoch on record (none after a
# reset, which deletes the epochs and the targets' rows: then at epoch 0).
_REGISTER = (
    "INSERT INTO twophase_targets (sink_id, target, delivered_epoch, from_epoch)"
    " SELECT %(s)s, n, last.epoch, COALESCE(last.epoch + 1, 0) FROM unnest(%(n)s::text[]) n,"
    " (SELECT max(epoch) AS epoch FROM twophase_epochs WHERE sink_id = %(s)s"
    " AND epoch >= 0 AND state = 'COMMITTED') last"
    " ON CONFLICT DO NOTHING RETURNING target, from_epoch"
)
# After a delivery: live once nothing COMMITTED is missing, else (still) lagging.
_SETTLE = (
    "UPDATE twophase_targets t SET updated_at = now(), state = CASE"
    " WHEN t.state = 'quarantined' THEN t.state"
    " WHEN EXISTS (SELECT 1 FROM twophase_target_backlog b WHERE b.sink_id = t.sink_id"
    " AND b.target = t.target) THEN 'lagging' ELSE 'live' END,"
    " lagging_since = CASE WHEN EXISTS (SELECT 1 FROM twophase_target_backlog b"
    " WHERE b.sink_id = t.sink_id AND b.target = t.target)"
    " THEN COALESCE(t.lagging_since, now()) END"
    " WHERE t.sink_id = %(s)s AND t.target = %(t)s RETURNING t.state"
)
_NEXT_MISSING = (
    "SELECT b.epoch, b.purged_at IS NOT NULL FROM twophase_target_backlog b"
    " JOIN twophase_targets t ON t.sink_id = b.sink_id AND t.target = b.target"
    " WHERE b.sink_id = %s AND b.target = %s AND (%s OR t.state <> 'quarantined')"
    " ORDER BY b.epoch LIMIT 1"
)
_QUARANTINE = (
    "UPDATE twophase_targets t SET state = 'quarantined', quarantined_at = now(),"
    " updated_at = now() WHERE t.state <> 'quarantined'"
    " AND (%(s)s::text IS NULL OR t.sink_id = %(s)s) AND EXISTS (SELECT 1"
    " FROM twophase_target_backlog b WHERE b.sink_id = t.sink_id AND b.target = t.target"
    " AND b.committed_at < now() - make_interval(secs => %(lag)s))"
    " RETURNING t.sink_id, t.target"
)
_FIRST_MISSING = "SELECT min(epoch) FROM twophase_target_backlog WHERE sink_id = %s AND target = %s"


class TargetLedger:
    """The per-target cursors and states of sinks with several targets."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def register(self, sink_id: str, names: Sequence[str]) -> None:
        """Record the targets a sink delivers to. A target new to the sink starts at
        the next epoch: it is owed every epoch above the sink's last COMMITTED one
        (those PRECOMMITTED now included). Known targets are left as they are."""
        self._db.retry("register targets", lambda: self._register(sink_id, names))

    def _register(self, sink_id: str, names: Sequence[str]) -> None:
        with self._db.transaction() as cur:
            cur.execute(_REGISTER, {"s": sink_id, "n": list(names)})
            for target, first in cur.fetchall():
                event(cur, sink_id, None, "target_added", None, f"{target}: from epoch {first}")

    def places(self, sink_id: str, epoch: int, names: Sequence[str]) -> list[Place]:
        """Where each of ``names`` stands for ``epoch`` (one query)."""
        return self._db.retry("targets", lambda: self._places(sink_id, epoch, names))

    def _places(self, sink_id: str, epoch: int, names: Sequence[str]) -> list[Place]:
        with self._db.transaction() as cur:
            cur.execute(_PLACES, {"s": sink_id, "e": epoch, "n": list(names)})
            return [
                Place(t, owed, None if d is None else (int(d), int(r)), bool(caught))
                for t, owed, d, r, caught in cur.fetchall()
            ]

    def delivered(
        self, sink_id: str, target: str, epoch: int, counts: tuple[int, int], run_id: str | None
    ) -> str:
        """Record that ``target`` acknowledged ``epoch`` (``counts``: delivered,
        rejected) and move its cursor there (a Spark epoch). Idempotent. Returns the
        target's state after it: ``live`` once it holds every COMMITTED epoch it is
        owed. The caller delivers only the epoch next in the target's order (I9)."""
        return self._db.retry(
            "record delivery", lambda: self._delivered(sink_id, target, epoch, counts, run_id)
        )

    def _delivered(
        self, sink_id: str, target: str, epoch: int, counts: tuple[int, int], run_id: str | None
    ) -> str:
        with self._db.transaction() as cur:
            cur.execute(
                "INSERT INTO twophase_target_deliveries"
                " (sink_id, target, epoch, delivered, rejected, run_id)"
                " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                (sink_id, target, epoch, counts[0], counts[1], run_id),
            )
            if epoch >= 0:
                cur.execute(
                    "UPDATE twophase_targets SET last_error = NULL, delivered_epoch ="
                    " GREATEST(COALESCE(delivered_epoch, %(e)s), %(e)s)"
                    " WHERE sink_id = %(s)s AND target = %(t)s",
                    {"s": sink_id, "t": target, "e": epoch},
                )
            state = _settle(cur, sink_id, target)
            crash_point("in_deliver", sink_id)
            return state

    def lagging(self, sink_id: str, target: str, error: str) -> None:
        """A commit left ``target`` without its epoch: lagging (unless quarantined), with
        the error; the catch-up worker delivers its backlog."""
        self._db.retry("target lagging", lambda: self._lagging(sink_id, target, error))

    def _lagging(self, sink_id: str, target: str, error: str) -> None:
        with self._db.transaction() as cur:
            cur.execute(
                "SELECT state FROM twophase_targets WHERE sink_id = %s AND target = %s FOR UPDATE",
                (sink_id, target),
            )
            row = cur.fetchone()
            cur.execute(
                "UPDATE twophase_targets SET last_error = %(m)s, updated_at = now(),"
                " lagging_since = COALESCE(lagging_since, now()), state = CASE"
                " WHEN state = 'quarantined' THEN state ELSE 'lagging' END"
                " WHERE sink_id = %(s)s AND target = %(t)s",
                {"s": sink_id, "t": target, "m": error},
            )
            if row is not None and row[0] == LIVE:
                event(cur, sink_id, None, "target_lagging", None, f"{target}: {error}")

    def next_missing(
        self, sink_id: str, target: str, quarantined: bool = False
    ) -> tuple[int, bool] | None:
        """The oldest COMMITTED epoch ``target`` is owed and does not hold, and whether
        GC purged its points; None when it misses nothing, or is quarantined (unless
        ``quarantined``: a resync). The next epoch a catch-up delivers to it."""
        return self._db.retry(
            "target backlog", lambda: self._next_missing(sink_id, target, quarantined)
        )

    def _next_missing(
        self, sink_id: str, target: str, quarantined: bool
    ) -> tuple[int, bool] | None:
        with self._db.transaction() as cur:
            cur.execute(_NEXT_MISSING, (sink_id, target, quarantined))
            row = cur.fetchone()
            return None if row is None else (int(row[0]), bool(row[1]))

    def quarantine(self, sink_id: str | None, max_lag_s: float) -> list[tuple[str, str]]:
        """Quarantine every target whose oldest missing COMMITTED epoch was committed
        more than ``max_lag_s`` ago: it stops holding retention (GC may purge what it
        lacks). Returns (sink, target) of each newly quarantined, with an event."""
        return self._db.retry("quarantine", lambda: self._quarantine(sink_id, max_lag_s))

    def _quarantine(self, sink_id: str | None, max_lag_s: float) -> list[tuple[str, str]]:
        with self._db.transaction() as cur:
            cur.execute(_QUARANTINE, {"s": sink_id, "lag": max_lag_s})
            done = [(s, t) for s, t in cur.fetchall()]
            for sink, target in done:
                detail = f"{target}: lagging more than {max_lag_s:g} s"
                event(cur, sink, None, "target_quarantined", None, detail)
            return done

    def restart(self, sink_id: str, target: str, from_epoch: int | None) -> int | None:
        """Resync's first step: the target becomes live again, owed every COMMITTED epoch
        from ``from_epoch`` (default: its first missing one) on; its cursor is set just
        below. Returns the epoch it now starts at (None: it misses nothing)."""
        return self._db.retry("resync target", lambda: self._restart(sink_id, target, from_epoch))

    def _restart(self, sink_id: str, target: str, from_epoch: int | None) -> int | None:
        with self._db.transaction() as cur:
            if from_epoch is None:
                cur.execute(_FIRST_MISSING, (sink_id, target))
                row = cur.fetchone()
                from_epoch = None if row is None or row[0] is None else int(row[0])
            if from_epoch is not None:
                cur.execute(
                    "UPDATE twophase_targets SET delivered_epoch = %(e)s - 1, from_epoch ="
                    " LEAST(from_epoch, %(e)s) WHERE sink_id = %(s)s AND target = %(t)s",
                    {"s": sink_id, "t": target, "e": from_epoch},
                )
            cur.execute(
                "UPDATE twophase_targets SET state = 'live', quarantined_at = NULL,"
                " lagging_since = NULL, updated_at = now() WHERE sink_id = %s AND target = %s",
                (sink_id, target),
            )
            _settle(cur, sink_id, target)
            event(cur, sink_id, None, "target_resync", None, f"{target}: from {from_epoch}")
            return from_epoch

    def skip_purged(self, sink_id: str, target: str, epoch: int) -> None:
        """Resync found ``epoch`` purged: the target cannot get it from staging any more;
        its cursor moves past it (the operator was told)."""
        self._db.retry("skip purged", lambda: self._skip(sink_id, target, epoch))

    def _skip(self, sink_id: str, target: str, epoch: int) -> None:
        with self._db.transaction() as cur:
            cur.execute(
                "UPDATE twophase_targets SET delivered_epoch = GREATEST(delivered_epoch, %s)"
                " WHERE sink_id = %s AND target = %s",
                (epoch, sink_id, target),
            )
            _settle(cur, sink_id, target)
            event(cur, sink_id, epoch, "target_skipped", None, f"{target}: purged, not sent")

    def states(self, sink_id: str | None = None) -> list[TargetState]:
        """Every target of the sink (of every sink: None), with its lag."""
        with self._db.transaction() as cur:
            cur.execute(_STATES, {"s": sink_id})
            return [_state(row) for row in cur.fetchall()]


def _settle(cur: Cursor, sink_id: str, target: str) -> str:
    cur.execute(_SETTLE, {"s": sink_id, "t": target})
    row = cur.fetchone()
    return str(row[0]) if row else LIVE


def _state(row: Sequence[Any]) -> TargetState:
    sink, target, state, cursor, first, n, age, size, missing, since, quarantined, error = row
    return TargetState(
        sink_id=sink,
        target=target,
        state=state,
        delivered_epoch=cursor,
        from_epoch=int(first),
        lag_epochs=int(n),
        lag_seconds=None if age is None else round(float(age), 3),
        lag_bytes=int(size),
        first_missing=missing,
        lagging_since=since,
        quarantined_at=quarantined,
        last_error=error,
    )


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()
