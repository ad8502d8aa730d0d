"""Per-target delivery state: which epochs each named target of a sink holds.

Every sink has targets: the one ``target_url`` makes (named ``default``) or
the named ones of ``targets``. A sink decides each epoch once (I1) and
then delivers it to each target **in epoch order**. Per target the store
keeps a cursor, ``delivered_epoch``: every COMMITTED epoch of the sink from
the target's ``from_epoch`` up to the cursor is in the target (I9: per
target, the delivered epochs are a prefix of the COMMITTED ones). A
promotion delivers epoch N only to a target that is *caught up* (the cursor
holds every COMMITTED epoch below N), so a lagging target never receives
N+1 before N; the catch-up ([`twophase.protocol.commit.catchup`][twophase.protocol.commit.catchup])
moves a lagging cursor on, one COMMITTED epoch at a time. A correction (epoch < 0) is
owed to the target it names (every target: none named) that was added before
it was decided; it has no cursor, its delivery row records it.

    live --a commit gave up on it--> lagging --caught up--> live
      lagging --behind longer than target_max_lag, or by more than
               target_max_backlog_bytes--> quarantined
      quarantined --resync (lag clock restarted), backlog delivered--> live

Every method is one transaction, safe to repeat (``Database.retry``): a
delivery is recorded once per target and epoch, and recording it again
changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from twophase.errors import StateError, TargetOrderError
from twophase.faults import crash_point
from twophase.logs import lease_fields
from twophase.model import Lease
from twophase.protocol.ledger.transitions import Cursor, check_fence, event
from twophase.store.database import Database

__all__ = [
    "LAGGING",
    "LIVE",
    "QUARANTINED",
    "Place",
    "Quarantine",
    "TargetLedger",
    "TargetRoster",
    "TargetState",
    "UrlChange",
]

LIVE, LAGGING, QUARANTINED = "live", "lagging", "quarantined"
log = logging.getLogger("twophase.protocol.targets")


@dataclass(frozen=True)
class Place:
    """Where a target stands for one epoch's promotion."""

    target: str
    state: str  # live, lagging or quarantined
    owed: bool  # the epoch is one the target must get (not before its from_epoch)
    has: tuple[int, int] | None  # (delivered, rejected) once it got the epoch
    caught_up: bool  # it holds every COMMITTED epoch it is owed below this one


@dataclass(frozen=True)
class Quarantine:
    """A target a collection quarantined, and why: the bound it passed."""

    sink_id: str
    target: str
    reason: str  # "lagging more than 3600 s", "backlog of N bytes past ..."


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
    first_missing: int | None  # the oldest Spark epoch of them
    lagging_since: datetime | None
    quarantined_at: datetime | None
    last_error: str | None
    url: str | None = None  # as its query's last run registered it, without credentials
    url_changed_at: datetime | None = None  # when a run last registered another URL
    lag_corrections: int = 0  # of lag_epochs, the corrections (epoch < 0)

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
            "url": self.url,
            "url_changed_at": _iso(self.url_changed_at),
            "lag_corrections": self.lag_corrections,
        }


# The view twophase_target_backlog (migration 0009) is each target's backlog: the
# COMMITTED epochs it is owed past its cursor, and the COMMITTED corrections it is owed
# (naming it or no target, decided since it was added) without a delivery of.
_OWED = (
    "CASE WHEN %(e)s < 0 THEN (ep.target IS NULL OR ep.target = t.target)"
    " AND ep.decided_at >= t.added_at ELSE %(e)s >= t.from_epoch END"
)
_CAUGHT_UP = (
    "NOT EXISTS (SELECT 1 FROM twophase_target_backlog b WHERE b.sink_id = t.sink_id"
    " AND b.target = t.target AND b.position < %(p)s)"
)
_PLACES = (
    f"SELECT t.target, t.state, {_OWED}, d.delivered, d.rejected, {_CAUGHT_UP}"  # noqa: S608
    " FROM twophase_targets t LEFT JOIN twophase_target_deliveries d"
    " ON d.sink_id = t.sink_id AND d.target = t.target AND d.epoch = %(e)s"
    " LEFT JOIN twophase_epochs ep ON ep.sink_id = t.sink_id AND ep.epoch = %(e)s"
    " WHERE t.sink_id = %(s)s AND t.target = ANY(%(n)s) ORDER BY t.target"
)
# Each target's backlog aggregated in a LATERAL sub-select: evaluated per target, with
# the target's sink and cursor as the bounds of its index range, however the statement
# is planned. A join of every target with the view, planned as a whole (a generic plan
# does, not knowing the sink), hashes the view and reads every epoch in the store.
_STATES = (
    "SELECT t.sink_id, t.target, t.state, t.delivered_epoch, t.from_epoch, b.n,"
    " EXTRACT(EPOCH FROM now() - b.oldest), b.bytes, b.first, t.lagging_since,"
    " t.quarantined_at, t.last_error, t.url, t.url_changed_at, b.corrections"
    " FROM twophase_targets t CROSS JOIN LATERAL (SELECT count(*) AS n,"
    " min(l.committed_at) AS oldest, COALESCE(sum(l.staged_bytes), 0) AS bytes,"
    " min(l.epoch) FILTER (WHERE l.epoch >= 0) AS first,"
    " count(*) FILTER (WHERE l.epoch < 0) AS corrections FROM twophase_target_backlog l"
    " WHERE l.sink_id = t.sink_id AND l.target = t.target) b"
    " WHERE (%(s)s::text IS NULL OR t.sink_id = %(s)s) ORDER BY t.sink_id, t.target"
)
# A new target starts after the sink's last COMMITTED epoch on record (none after a
# reset, which deletes the epochs and the targets' rows: then at epoch 0), in the
# sink's last generation (a reset gave out a new one).
_REGISTER = (
    "INSERT INTO twophase_targets"
    " (sink_id, target, delivered_epoch, from_epoch, url, generation)"
    " SELECT %(s)s, n.target, last.epoch, COALESCE(last.epoch + 1, 0), n.url,"
    " (SELECT generation FROM twophase_sinks WHERE sink_id = %(s)s)"
    " FROM unnest(%(n)s::text[], %(u)s::text[]) AS n(target, url),"
    " (SELECT max(epoch) AS epoch FROM twophase_epochs WHERE sink_id = %(s)s"
    " AND epoch >= 0 AND state = 'COMMITTED') last"
    " ON CONFLICT DO NOTHING RETURNING target, from_epoch"
)
# The generation a target's deliveries are recorded under; the sink's for a target it
# has no row of (none is delivered to before its query's claim registers it).
_GENERATION = (
    "SELECT COALESCE((SELECT generation FROM twophase_targets WHERE sink_id = %(s)s"
    " AND target = %(t)s), generation) FROM twophase_sinks WHERE sink_id = %(s)s"
)
# The sink's next generation, given to one target: never given out before for the sink
# (the sink's counts every one given out; its targets' are at most it), so no record
# of a target of that name, even of one removed since, names it.
_NEW_GENERATION = (
    "WITH g AS (UPDATE twophase_sinks s SET generation = GREATEST(s.generation,"
    " (SELECT max(t.generation) FROM twophase_targets t WHERE t.sink_id = s.sink_id)) + 1"
    " WHERE s.sink_id = %(s)s RETURNING s.generation)"
    " UPDATE twophase_targets t SET generation = g.generation FROM g"
    " WHERE t.sink_id = %(s)s AND t.target = %(t)s RETURNING t.generation"
)
_URLS = (
    "UPDATE twophase_targets t SET url = n.url, updated_at = now(),"
    " url_changed_at = CASE WHEN t.url IS NULL THEN t.url_changed_at ELSE now() END"
    " FROM unnest(%(n)s::text[], %(u)s::text[]) AS n(target, url),"
    " (SELECT target, url FROM twophase_targets WHERE sink_id = %(s)s FOR UPDATE) old"
    " WHERE t.sink_id = %(s)s AND t.target = n.target AND old.target = n.target"
    " AND t.url IS DISTINCT FROM n.url RETURNING t.target, old.url, n.url"
)
# After a delivery or a resync: live once nothing COMMITTED is missing; else lagging
# (quarantined stays quarantined until its backlog is delivered).
# A target's state from ``b.behind`` (whether it still lacks something): one rule for
# every statement that moves a target.
_STATE_AFTER = (
    " state = CASE WHEN NOT b.behind THEN 'live' WHEN t.state = 'quarantined' THEN t.state"
    " ELSE 'lagging' END,"
    " lagging_since = CASE WHEN b.behind THEN COALESCE(t.lagging_since, now()) END,"
    " quarantined_at = CASE WHEN b.behind THEN t.quarantined_at END"
)
_SETTLE = (
    "WITH b AS (SELECT EXISTS (SELECT 1 FROM twophase_target_backlog"  # noqa: S608
    " WHERE sink_id = %(s)s AND target = %(t)s) AS behind)"
    f" UPDATE twophase_targets t SET updated_at = now(),{_STATE_AFTER}"
    " FROM b WHERE t.sink_id = %(s)s AND t.target = %(t)s RETURNING t.state"
)
_NEXT_MISSING = (
    "SELECT b.epoch, b.purged_at IS NOT NULL FROM twophase_target_backlog b"
    " JOIN twophase_targets t ON t.sink_id = b.sink_id AND t.target = b.target"
    " WHERE b.sink_id = %s AND b.target = %s AND (%s OR t.state <> 'quarantined')"
    " AND b.position < %s ORDER BY b.position LIMIT 1"
)
# The lag clock of an epoch a target lacks runs from its commit, or from the target's
# last resync when that is later: a resync under way is not undone by a collection. The
# byte bound likewise counts the epochs committed since the last resync only (a resync
# starts with the backlog that had the target quarantined). Both bounds are looked at
# per target in one statement: the lag's an index range that stops at its first late
# epoch; the bytes' (only with a bound: %(bytes)s > 0) sums the target's backlog, as
# the exporter's twophase_target_lag_bytes does (staged bytes as stored).
_QUARANTINE = (
    "WITH b AS (SELECT t.sink_id, t.target, (SELECT true FROM twophase_target_backlog l"
    " WHERE l.sink_id = t.sink_id AND l.target = t.target"
    " AND GREATEST(l.committed_at, t.resynced_at) < now() - make_interval(secs => %(lag)s)"
    " LIMIT 1) AS late, CASE WHEN %(bytes)s > 0 THEN (SELECT COALESCE(sum(l.staged_bytes), 0)"
    " FROM twophase_target_backlog l WHERE l.sink_id = t.sink_id AND l.target = t.target"
    " AND l.committed_at > COALESCE(t.resynced_at, '-infinity')) END AS bytes"
    " FROM twophase_targets t WHERE t.state <> 'quarantined'"
    " AND (%(s)s::text IS NULL OR t.sink_id = %(s)s))"
    " UPDATE twophase_targets t SET state = 'quarantined', quarantined_at = now(),"
    " updated_at = now() FROM b WHERE t.sink_id = b.sink_id AND t.target = b.target"
    " AND t.state <> 'quarantined' AND (b.late OR b.bytes > %(bytes)s)"
    " RETURNING t.sink_id, t.target, COALESCE(b.late, false), b.bytes"
)
# A scalar sub-select, not EXISTS: the planner keeps it per target (an index range past
# its cursor); an EXISTS becomes a semi-join, which a generic plan hashes over the whole
# view, reading every epoch in the store at each collection.
_FIRST_MISSING = (
    "SELECT min(epoch) FROM twophase_target_backlog WHERE sink_id = %s AND target = %s"
    " AND epoch >= 0"
)
_FENCE = "SELECT fencing_token, owner_run_id FROM twophase_sinks WHERE sink_id = %s FOR SHARE"
# The target's row locked, and the oldest epoch it lacks below the one to record.
_IN_ORDER = (
    "SELECT (SELECT min(epoch) FROM twophase_target_backlog WHERE sink_id = %s"
    " AND target = %s AND position < %s) FROM twophase_targets"
    " WHERE sink_id = %s AND target = %s FOR UPDATE"
)
# A delivery, the cursor moved to it (a Spark epoch past the cursor) and the state after
# it, in one statement. Its parts see the backlog as before it: the target is behind
# after it if it lacks an epoch other than this one.
_DELIVERY = (
    " d AS (INSERT INTO twophase_target_deliveries"  # noqa: S608
    " (sink_id, target, epoch, delivered, rejected, run_id)"
    " VALUES (%(s)s, %(t)s, %(e)s, %(d)s, %(r)s, %(run)s) ON CONFLICT DO NOTHING),"
    " b AS (SELECT EXISTS (SELECT 1 FROM twophase_target_backlog WHERE sink_id = %(s)s"
    " AND target = %(t)s AND epoch <> %(e)s) AS behind)"
    " UPDATE twophase_targets t SET updated_at = now(),"
    " delivered_epoch = CASE WHEN %(e)s >= 0 AND COALESCE(t.delivered_epoch < %(e)s, true)"
    " THEN %(e)s ELSE t.delivered_epoch END,"
    f" last_error = CASE WHEN %(e)s >= 0 THEN NULL ELSE t.last_error END,{_STATE_AFTER}"
)
_RECORD = f"WITH{_DELIVERY} FROM b WHERE t.sink_id = %(s)s AND t.target = %(t)s RETURNING t.state"
# A Spark epoch recorded in the mark's transaction, the common case in one cheap
# statement: a target that lacks nothing is live (whatever leaves a target without an
# epoch or a correction marks it lagging or quarantined first, and settles it live only
# once its backlog is empty), so a live target whose cursor holds the sink's last
# COMMITTED epoch below this one is in order. No row back: the caller takes the general
# way (`_record`), which checks the whole backlog and raises if it is out of order.
_RECORD_NEXT = (
    "WITH last AS (SELECT max(epoch) AS epoch FROM twophase_epochs WHERE sink_id = %(s)s"
    " AND epoch >= 0 AND epoch < %(e)s AND state = 'COMMITTED'),"
    " d AS (INSERT INTO twophase_target_deliveries"
    " (sink_id, target, epoch, delivered, rejected, run_id)"
    " VALUES (%(s)s, %(t)s, %(e)s, %(d)s, %(r)s, %(run)s) ON CONFLICT DO NOTHING)"
    " UPDATE twophase_targets t SET updated_at = now(), last_error = NULL,"
    " delivered_epoch = GREATEST(t.delivered_epoch, %(e)s) FROM last"
    " WHERE t.sink_id = %(s)s AND t.target = %(t)s AND t.state = 'live'"
    " AND (last.epoch IS NULL OR last.epoch < t.from_epoch OR t.delivered_epoch >= last.epoch)"
    " RETURNING t.state"
)
_TARGET_ROW = (
    "SELECT delivered_epoch, from_epoch FROM twophase_targets"
    " WHERE sink_id = %s AND target = %s FOR UPDATE"
)
_NO_BOUND = 2**63 - 1  # "below no position" for next_missing
_CORRECTIONS_FIRST = 2**62  # as the view's position: corrections, then Spark epochs


def position(epoch: int) -> int:
    """An epoch's place in a target's order, as the view ``twophase_target_backlog``
    gives it: corrections first, in the order they were decided (-1, -2, ...), then
    Spark's epochs in increasing order."""
    return -epoch - _CORRECTIONS_FIRST if epoch < 0 else epoch


@dataclass(frozen=True)
class UrlChange:
    """A target whose name now points at another server than it was registered with."""

    target: str
    was: str | None
    now: str


@dataclass(frozen=True)
class TargetRoster:
    """The targets a configuration names, (name, URL without credentials) each, as a
    query's claim registers them for its sink."""

    ledger: TargetLedger
    targets: tuple[tuple[str, str], ...]

    def register(self, lease: Lease) -> list[UrlChange]:
        """Register the targets for the lease's sink; warn of each whose URL changed."""
        changes = self.ledger.register(lease.sink_id, self.targets)
        for change in changes:
            log.warning(
                "sink %s: target %s now points at %s (was %s): it holds the sink's history "
                "only if that server has it; `twophase targets resync %s --from-epoch 0 "
                "--sink %s` sends what staging retains",
                lease.sink_id,
                change.target,
                change.now,
                change.was or "not recorded",
                change.target,
                lease.sink_id,
                extra=lease_fields(lease),
            )
        return changes

    def unknown(self, sink_id: str) -> list[str]:
        """The configured targets the sink does not have (its query never ran with them)."""
        known = {s.target for s in self.ledger.states(sink_id)}
        return [name for name, _ in self.targets if name not in known]


class TargetLedger:
    """The per-target cursors and states of every sink.

    A cursor moves only from the epoch below to the next (I9): a delivery is
    recorded only when the target holds every COMMITTED epoch it is owed below
    it, in a transaction that holds the target's row and checks the
    recording run's lease, so a late record of a fenced run, or one that
    follows a resync's rewind, is refused (TargetOrderError, FencedError)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def register(self, sink_id: str, targets: Sequence[tuple[str, str]]) -> list[UrlChange]:
        """Record the targets (name, URL without credentials) a query's run delivers to.
        A target new to the sink starts at the next epoch: it is owed every epoch above
        the sink's last COMMITTED one (those PRECOMMITTED now included). A known
        target keeps its cursor; a changed URL is stored, with an event, and returned.
        Only a query's run registers: an operator's command never creates a target."""
        return self._db.retry("register targets", lambda: self._register(sink_id, targets))

    def _register(self, sink_id: str, targets: Sequence[tuple[str, str]]) -> list[UrlChange]:
        params = {"s": sink_id, "n": [n for n, _ in targets], "u": [u for _, u in targets]}
        with self._db.transaction() as cur:
            cur.execute(_REGISTER, params)
            new = cur.fetchall()
            added = {target for target, _ in new}
            for target, first in new:
                event(cur, sink_id, None, "target_added", None, f"{target}: from epoch {first}")
            cur.execute(_URLS, params)
            changes = [
                UrlChange(t, was, now)
                for t, was, now in cur.fetchall()
                if t not in added and was is not None  # a first record (after 0009) is none
            ]
            for change in changes:
                detail = f"{change.target}: {change.was or '(not recorded)'} -> {change.now}"
                event(cur, sink_id, None, "target_url_changed", None, detail)
            return changes

    def generation(self, sink_id: str, target: str) -> int:
        """The generation of the sink's epoch numbers on ``target``: what a transactional
        target's record of an epoch names, so that the records of numbers a reset or a
        ``resync --from-epoch`` has given out again never skip an epoch. StateError for
        an unknown sink."""
        return self._db.retry("target generation", lambda: self._generation(sink_id, target))

    def _generation(self, sink_id: str, target: str) -> int:
        with self._db.transaction() as cur:
            cur.execute(_GENERATION, {"s": sink_id, "t": target})
            row = cur.fetchone()
            if row is None:
                raise StateError(f"unknown sink {sink_id!r}")
            return int(row[0])

    def places(self, sink_id: str, epoch: int, names: Sequence[str]) -> list[Place]:
        """Where each of ``names`` (registered for the sink) stands for ``epoch``."""
        return self._db.retry("targets", lambda: self._places(sink_id, epoch, names))

    def _places(self, sink_id: str, epoch: int, names: Sequence[str]) -> list[Place]:
        with self._db.transaction() as cur:
            cur.execute(_PLACES, {"s": sink_id, "e": epoch, "p": position(epoch), "n": list(names)})
            return [
                Place(t, state, owed, None if d is None else (int(d), int(r)), bool(caught))
                for t, state, owed, d, r, caught in cur.fetchall()
            ]

    def delivered(self, lease: Lease, target: str, epoch: int, counts: tuple[int, int]) -> str:
        """Record that ``target`` acknowledged ``epoch`` (``counts``: delivered,
        rejected) and move its cursor there (a Spark epoch). Idempotent. Returns the
        target's state after it: ``live`` once it holds every COMMITTED epoch it is
        owed. FencedError once a newer run holds the sink than ``lease``;
        TargetOrderError, nothing recorded, unless the target holds every COMMITTED
        epoch it is owed below ``epoch`` (I9)."""
        return self._db.retry(
            "record delivery", lambda: self._delivered(lease, target, epoch, counts)
        )

    def _delivered(self, lease: Lease, target: str, epoch: int, counts: tuple[int, int]) -> str:
        with self._db.transaction() as cur:
            _check_lease(cur, lease)
            return _record(cur, lease, target, epoch, counts)

    @staticmethod
    def record(
        cur: Cursor, *, lease: Lease, epoch: int, counts: dict[str, tuple[int, int]]
    ) -> None:
        """`delivered` for each target of ``counts``, inside the caller's transaction
        (the mark's, which holds the sink's row FOR UPDATE and checked the lease): an
        epoch's deliveries and its COMMITTED state land in one commit. One cheap
        statement per target in the common case (`_RECORD_NEXT`), else the whole
        check, which raises out of order and so rolls the mark back (nothing else
        moves a target's cursor while the sink's row is held: a resync's restart and
        a catch-up's record both hold it FOR SHARE first)."""
        for target, each in counts.items():
            if epoch >= 0:
                cur.execute(_RECORD_NEXT, _record_params(lease, target, epoch, each))
                if cur.fetchone() is not None:
                    crash_point("in_deliver", lease.sink_id)
                    continue
            _record(cur, lease, target, epoch, each)  # checked whole; raises out of order

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
        self,
        sink_id: str,
        target: str,
        quarantined: bool = False,
        below: int | None = None,
    ) -> tuple[int, bool] | None:
        """The oldest COMMITTED epoch (or correction) ``target`` is owed and does not
        hold, and whether GC purged its points; None when it misses nothing (below
        ``below``), or is quarantined (unless ``quarantined``: a resync). The next
        epoch a catch-up delivers to it."""
        bound = _NO_BOUND if below is None else position(below)
        return self._db.retry(
            "target backlog", lambda: self._next_missing(sink_id, target, quarantined, bound)
        )

    def _next_missing(
        self, sink_id: str, target: str, quarantined: bool, below: int
    ) -> tuple[int, bool] | None:
        with self._db.transaction() as cur:
            cur.execute(_NEXT_MISSING, (sink_id, target, quarantined, below))
            row = cur.fetchone()
            return None if row is None else (int(row[0]), bool(row[1]))

    def purged(self, sink_id: str, epoch: int) -> bool:
        """Whether GC purged the epoch's staged points."""
        with self._db.transaction() as cur:
            cur.execute(
                "SELECT purged_at IS NOT NULL FROM twophase_epochs WHERE sink_id = %s"
                " AND epoch = %s",
                (sink_id, epoch),
            )
            row = cur.fetchone()
            return bool(row and row[0])

    def quarantine(
        self, sink_id: str | None, max_lag_s: float, max_backlog_bytes: int = 0
    ) -> list[Quarantine]:
        """Quarantine every target whose oldest missing COMMITTED epoch was committed
        (or the target resynced) more than ``max_lag_s`` ago, or whose backlog committed
        since its last resync holds more than ``max_backlog_bytes`` staged bytes (0: no
        such bound): it stops holding retention (GC may purge what it lacks). Returns
        each newly quarantined, with the bound it passed, and records an event each.
        Idempotent: a quarantined target is left as it is."""
        return self._db.retry(
            "quarantine", lambda: self._quarantine(sink_id, max_lag_s, max_backlog_bytes)
        )

    def _quarantine(
        self, sink_id: str | None, max_lag_s: float, max_bytes: int
    ) -> list[Quarantine]:
        with self._db.transaction() as cur:
            cur.execute(_QUARANTINE, {"s": sink_id, "lag": max_lag_s, "bytes": max_bytes})
            done = [
                Quarantine(s, t, _why(late, size, max_lag_s, max_bytes))
                for s, t, late, size in cur.fetchall()
            ]
            for each in done:
                detail = f"{each.target}: {each.reason}"
                event(cur, each.sink_id, None, "target_quarantined", None, detail)
            return done

    def restart(
        self, lease: Lease | None, sink_id: str, target: str, from_epoch: int | None
    ) -> int | None:
        """Resync's first step, under the resync's ``lease`` (None: nothing is owed, no
        claim was needed to make a quarantined target live): the target becomes live
        again and its lag clock restarts; it is owed every COMMITTED epoch from
        ``from_epoch`` (default: its first missing one) on, its cursor set just below
        under its row's lock. Given a ``from_epoch``, the corrections it holds are owed
        to it again too, and the target starts a new generation (a transactional
        target's records of what it held are inert: everything is sent again). Returns
        the epoch it now starts at (None: it misses nothing).
        ValueError for a negative ``from_epoch`` (corrections are not a place to start)."""
        if from_epoch is not None and from_epoch < 0:
            raise ValueError(f"from_epoch must be 0 or more, not {from_epoch}")
        return self._db.retry(
            "resync target", lambda: self._restart(lease, sink_id, target, from_epoch)
        )

    def _restart(
        self, lease: Lease | None, sink_id: str, target: str, from_epoch: int | None
    ) -> int | None:
        run_id = None
        with self._db.transaction() as cur:
            if lease is not None:
                _check_lease(cur, lease)
                run_id = lease.run_id
            else:  # no claim, but still not beside a mark recording this target
                cur.execute("SELECT 1 FROM twophase_sinks WHERE sink_id = %s FOR SHARE", (sink_id,))
            cur.execute(_TARGET_ROW, (sink_id, target))
            if from_epoch is None:
                cur.execute(_FIRST_MISSING, (sink_id, target))
                row = cur.fetchone()
                from_epoch = None if row is None or row[0] is None else int(row[0])
            else:
                cur.execute(
                    "DELETE FROM twophase_target_deliveries WHERE sink_id = %s AND target = %s"
                    " AND epoch < 0",
                    (sink_id, target),
                )
                # What it is sent again must reach it even where its own record (of a
                # transactional kind) says it holds the epoch: the target lost rows,
                # or is another server. A new generation makes those records inert.
                cur.execute(_NEW_GENERATION, {"s": sink_id, "t": target})
            if from_epoch is not None:
                cur.execute(
                    "UPDATE twophase_targets SET delivered_epoch = %(e)s - 1, from_epoch ="
                    " LEAST(from_epoch, %(e)s) WHERE sink_id = %(s)s AND target = %(t)s",
                    {"s": sink_id, "t": target, "e": from_epoch},
                )
            cur.execute(
                "UPDATE twophase_targets SET state = 'live', quarantined_at = NULL,"
                " lagging_since = NULL, resynced_at = now(), updated_at = now()"
                " WHERE sink_id = %s AND target = %s",
                (sink_id, target),
            )
            _settle(cur, sink_id, target)
            event(cur, sink_id, None, "target_resync", run_id, f"{target}: from {from_epoch}")
            return from_epoch

    def skip_purged(self, lease: Lease, target: str, epoch: int) -> None:
        """Resync found ``epoch`` purged: the target cannot get it from staging any more;
        it is recorded as passed over (the operator was told), in epoch order."""
        self._db.retry("skip purged", lambda: self._skip(lease, target, epoch))

    def _skip(self, lease: Lease, target: str, epoch: int) -> None:
        with self._db.transaction() as cur:
            _check_lease(cur, lease)
            _next_in_order(cur, lease.sink_id, target, epoch)
            if epoch < 0:  # a correction has no cursor: a delivery of nothing marks it
                cur.execute(
                    "INSERT INTO twophase_target_deliveries"
                    " (sink_id, target, epoch, delivered, rejected, run_id)"
                    " VALUES (%s, %s, %s, 0, 0, %s) ON CONFLICT DO NOTHING",
                    (lease.sink_id, target, epoch, lease.run_id),
                )
            else:
                cur.execute(
                    "UPDATE twophase_targets SET delivered_epoch = %s"
                    " WHERE sink_id = %s AND target = %s",
                    (epoch, lease.sink_id, target),
                )
            _settle(cur, lease.sink_id, target)
            event(cur, lease.sink_id, epoch, "target_skipped", None, f"{target}: purged, not sent")

    def states(self, sink_id: str | None = None) -> list[TargetState]:
        """Every target of the sink (of every sink: None), with its lag."""
        with self._db.transaction() as cur:
            cur.execute(_STATES, {"s": sink_id})
            return [_state(row) for row in cur.fetchall()]


def _why(late: bool, size: int | None, max_lag_s: float, max_bytes: int) -> str:
    """The bound a quarantined target passed (the lag's first when both)."""
    if late:
        return f"lagging more than {max_lag_s:g} s (target_max_lag)"
    return f"backlog of {size} bytes, more than {max_bytes} (target_max_backlog_bytes)"


def _record(cur: Cursor, lease: Lease, target: str, epoch: int, counts: tuple[int, int]) -> str:
    """Record one delivery in the caller's transaction: the order checked under the
    target's row lock, then the delivery, the cursor and the state in one statement."""
    _next_in_order(cur, lease.sink_id, target, epoch)
    cur.execute(_RECORD, _record_params(lease, target, epoch, counts))
    row = cur.fetchone()
    crash_point("in_deliver", lease.sink_id)
    return str(row[0]) if row else LIVE


def _record_params(
    lease: Lease, target: str, epoch: int, counts: tuple[int, int]
) -> dict[str, Any]:
    return {
        "s": lease.sink_id,
        "t": target,
        "e": epoch,
        "p": position(epoch),
        "d": counts[0],
        "r": counts[1],
        "run": lease.run_id,
    }


def _out_of_order(sink_id: str, target: str, epoch: int, missing: int) -> TargetOrderError:
    return TargetOrderError(
        f"sink {sink_id!r} epoch {epoch}: target {target!r} lacks epoch {missing} "
        "(its cursor moved meanwhile); not recorded as delivered",
        target,
    )


def _check_lease(cur: Cursor, lease: Lease) -> None:
    """FencedError unless ``lease`` still holds the sink (its row held FOR SHARE to the
    end of the transaction, so a claim waits for the step rather than cross it)."""
    cur.execute(_FENCE, (lease.sink_id,))
    row = cur.fetchone()
    if row is None:
        raise StateError(f"unknown sink {lease.sink_id!r}")
    check_fence({"fencing_token": row[0], "owner_run_id": row[1]}, lease)


def _next_in_order(cur: Cursor, sink_id: str, target: str, epoch: int) -> None:
    """Lock the target's row. TargetOrderError unless the target holds every COMMITTED
    epoch and correction it is owed below ``epoch`` (I9), or when the sink has no such
    target: an operator removed it (`twophase targets remove`) under a run that still
    delivers to it, whose commit then leaves it out (the others hold the epoch)."""
    cur.execute(_IN_ORDER, (sink_id, target, position(epoch), sink_id, target))
    row = cur.fetchone()
    if row is None:
        raise TargetOrderError(
            f"sink {sink_id!r} has no target {target!r} (removed); not recorded as delivered",
            target,
        )
    if row[0] is not None:
        raise _out_of_order(sink_id, target, epoch, row[0])


def _settle(cur: Cursor, sink_id: str, target: str) -> str:
    cur.execute(_SETTLE, {"s": sink_id, "t": target})
    row = cur.fetchone()
    return str(row[0]) if row else LIVE


def _state(row: Sequence[Any]) -> TargetState:
    sink, target, state, cursor, first, n, age, size, missing, since, quarantined, error = row[:12]
    url, url_changed_at, corrections = row[12:]
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
        url=url,
        url_changed_at=url_changed_at,
        lag_corrections=int(corrections),
    )


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()
