"""Read-only views of the staging store for operators: sinks, epochs, their history,
dead letters.

Nothing here changes the store. Every query is parameterised; sink ids are data.
The dataclasses' field names are the keys of ``twophase ... --json`` (see
[`twophase.cli`][twophase.cli]), so renaming one is a breaking change of the CLI's output.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from twophase.errors import EpochRangeError, UnknownSinkError
from twophase.model import DeadLetter, EpochState, Phase
from twophase.store.database import Database

# Runs the CLI starts (recover) are named so; they never count as a live query.
CLI_RUN_PREFIX = "cli-"
LIVE_WINDOW_S = 600.0  # an owner active this recently is taken for a live query


@dataclass(frozen=True)
class EpochRange:
    """``first``..``last`` inclusive; None on a side means unbounded."""

    first: int | None = None
    last: int | None = None

    def describe(self) -> str:
        if self.first is None and self.last is None:
            return "all epochs"
        if self.first == self.last:
            return f"epoch {self.first}"
        return f"epochs {_side(self.first)}..{_side(self.last)}"


def _side(value: int | None) -> str:
    return "" if value is None else str(value)


@dataclass(frozen=True)
class SinkStatus:
    """One sink at a glance (``twophase status``)."""

    sink_id: str
    query_id: str | None
    owner_run_id: str | None
    owner_live: bool  # owner_state == "live": a query is running (refused without --force)
    # None (no owner, or the CLI's own run), "live", "ended" (it recorded its end),
    # "unknown" (silent past the live window without an end: killed, hung or cut off)
    owner_state: str | None
    owner_end_reason: str | None  # stopped or failed, once ended
    fencing_token: int
    updated_at: datetime
    last_decided_epoch: int | None
    last_committed_epoch: int | None
    precommitted_epochs: int
    oldest_precommitted_epoch: int | None
    oldest_precommitted_age_s: float | None
    staged_points: int
    staged_bytes: int
    dead_letters: int  # not requeued
    replays_detected: int
    last_error: str | None
    corrections: int  # corrections made (dead letters requeued): epochs -1..-n
    # GC compacted the records of the epochs up to it (each decided one was delivered)
    compacted_through: int | None = None


@dataclass(frozen=True)
class EpochInfo:
    """One epoch's row (``twophase epochs``); ``points_delivered`` is None until COMMITTED.

    A negative ``epoch`` is a correction
    ([`twophase.operations.requeuer`][twophase.operations.requeuer]).
    """

    sink_id: str
    epoch: int
    state: EpochState
    run_id: str | None
    writes: int
    points_staged: int
    points_delivered: int | None
    points_rejected_stage: int
    points_rejected_promote: int | None
    promote_attempts: int
    replays: int
    decided_at: datetime
    committed_at: datetime | None
    aborted_at: datetime | None
    purged_at: datetime | None
    last_error: str | None


@dataclass(frozen=True)
class EpochEvent:
    """One entry of an epoch's history (decided, committed, aborted, replayed, ...)."""

    at: datetime
    event: str
    run_id: str | None
    detail: str | None


# A dead letter ``d`` of a write a decision chose (a failed or duplicate task attempt
# rejected the same rows too, but its write is an orphan and its rejections do not count),
# or one a reset kept when it forgot the epoch that chose its write.
DECIDED_LETTER = (
    "(d.reset_at IS NOT NULL OR EXISTS (SELECT 1 FROM twophase_epochs e"
    " WHERE e.sink_id = d.sink_id AND e.epoch = d.epoch AND d.write_id = ANY(e.write_ids)))"
)

# The owning run's state (see SinkStatus.owner_state), over ``s`` and its run ``r``.
OWNER_STATE_SQL = """CASE
    WHEN s.owner_run_id IS NULL OR left(s.owner_run_id, %(cli_len)s) = %(cli)s THEN NULL
    WHEN r.ended_at IS NOT NULL THEN 'ended'
    WHEN s.updated_at >= now() - %(window)s * interval '1 second' THEN 'live'
    ELSE 'unknown' END"""
OWNER_RUN_SQL = "LEFT JOIN twophase_runs r ON r.sink_id = s.sink_id AND r.run_id = s.owner_run_id"

_STATUS_SQL = f"""
SELECT s.sink_id, s.query_id, s.owner_run_id, {OWNER_STATE_SQL}, r.end_reason,
       s.fencing_token, s.updated_at, s.last_decided_epoch, s.last_committed_epoch,
       p.n, p.first, extract(epoch FROM now() - p.since)::float8,
       st.n, st.bytes, dl.n, s.replays_detected, s.last_error, s.corrections,
       s.compacted_through
FROM twophase_sinks s {OWNER_RUN_SQL}
CROSS JOIN LATERAL (SELECT count(*) AS n, min(epoch) AS first, min(decided_at) AS since
    FROM twophase_epochs e WHERE e.sink_id = s.sink_id AND e.state = %(pre)s) p
CROSS JOIN LATERAL (SELECT COALESCE(sum(c.points), 0) AS n,
    COALESCE(sum(COALESCE(octet_length(c.body_gz), octet_length(c.body) - c.points + 1)), 0)
        AS bytes
    FROM twophase_writes w JOIN twophase_staged_chunks c ON c.write_id = w.write_id
    WHERE w.sink_id = s.sink_id) st
CROSS JOIN LATERAL (SELECT count(*) AS n FROM twophase_dead_letters d
    WHERE d.sink_id = s.sink_id AND d.requeued_in IS NULL AND {DECIDED_LETTER}) dl
WHERE %(sink)s::text IS NULL OR s.sink_id = %(sink)s
ORDER BY s.sink_id
"""  # noqa: S608 - constant fragments; every value is a parameter

# Dead letters read a page at a time (exports): bounded memory, a short transaction each.
_LETTER_PAGE = 2000
_DECIDED_DEAD_LETTERS = f"FROM twophase_dead_letters d WHERE d.sink_id = %s AND {DECIDED_LETTER}"

_EPOCH_COLUMNS = (
    "sink_id, epoch, state, run_id, cardinality(write_ids), points_staged, points_delivered,"
    " points_rejected_stage, points_rejected_promote, promote_attempts, replays, decided_at,"
    " committed_at, aborted_at, purged_at, last_error"
)


class Views:
    """Read-only queries; each method is one short transaction."""

    def __init__(self, db: Database):
        self._db = db

    def sink_ids(self) -> list[str]:
        with self._db.transaction() as cur:
            cur.execute("SELECT sink_id FROM twophase_sinks ORDER BY sink_id")
            return [row[0] for row in cur.fetchall()]

    def require_sink(self, sink_id: str) -> None:
        """Raise UnknownSinkError (naming the known sinks) unless the sink exists."""
        known = self.sink_ids()
        if sink_id in known:
            return
        hint = f"known sinks: {', '.join(known[:10])}" if known else "the store has no sinks"
        more = f" and {len(known) - 10} more" if len(known) > 10 else ""
        raise UnknownSinkError(f"unknown sink {sink_id!r} ({hint}{more})")

    def status(self, sink_id: str | None, live_window_s: float) -> list[SinkStatus]:
        params = {
            "sink": sink_id,
            "window": live_window_s,
            "pre": EpochState.PRECOMMITTED,
            "cli": CLI_RUN_PREFIX,
            "cli_len": len(CLI_RUN_PREFIX),
        }
        with self._db.transaction() as cur:
            cur.execute(_STATUS_SQL, params)
            return [_sink_status(row) for row in cur.fetchall()]

    def live_owner(self, sink_id: str, live_window_s: float) -> tuple[str, datetime] | None:
        """(run id, last activity) of the run owning the sink if it is live, else None.

        Live: not a CLI run, not ended, and the sink row was updated within the
        window (runs update it when they start, decide and commit).
        """
        params = {
            "sink": sink_id,
            "window": live_window_s,
            "cli": CLI_RUN_PREFIX,
            "cli_len": len(CLI_RUN_PREFIX),
        }
        with self._db.transaction() as cur:
            cur.execute(
                f"SELECT s.owner_run_id, s.updated_at FROM twophase_sinks s {OWNER_RUN_SQL}"  # noqa: S608
                f" WHERE s.sink_id = %(sink)s AND {OWNER_STATE_SQL} = 'live'",
                params,
            )
            row = cur.fetchone()
            return (row[0], row[1]) if row else None

    def epochs(
        self, sink_id: str, selection: EpochRange = EpochRange(), last_n: int | None = None
    ) -> list[EpochInfo]:
        """Epochs in ``selection`` in increasing order, corrections last; with ``last_n``
        only the last ``last_n`` Spark epochs and the last ``last_n`` corrections."""
        part = (
            f"(SELECT {_EPOCH_COLUMNS} FROM twophase_epochs WHERE sink_id = %s"  # noqa: S608
            " AND (%s::bigint IS NULL OR epoch >= %s) AND (%s::bigint IS NULL OR epoch <= %s)"
        )
        sql = (
            f"{part} AND epoch >= 0 ORDER BY epoch DESC LIMIT %s)"
            f" UNION ALL {part} AND epoch < 0 ORDER BY epoch ASC LIMIT %s)"
        )
        first, last = selection.first, selection.last
        where = (sink_id, first, first, last, last, last_n)
        with self._db.transaction() as cur:
            cur.execute(sql, where + where)
            rows = [_epoch_info(row) for row in cur.fetchall()]
        return sorted(rows, key=lambda e: (e.epoch < 0, abs(e.epoch)))

    def select_epochs(self, sink_id: str, selection: EpochRange) -> list[EpochInfo]:
        """Like `epochs`, but an empty result is an EpochRangeError saying what exists."""
        found = self.epochs(sink_id, selection)
        if found:
            return found
        count, low, high = self.epoch_bounds(sink_id)
        has = "has no epochs" if not count else f"has epochs {low}..{high}"
        floor = self.compacted_through(sink_id)
        if floor is not None:
            has += f" (the records of epochs up to {floor} were compacted by gc: delivered)"
        raise EpochRangeError(f"sink {sink_id!r} {has}; {selection.describe()} is not recorded")

    def compacted_through(self, sink_id: str) -> int | None:
        """The sink's compacted floor: GC deleted the records of the epochs up to it, every
        one of which that was decided is COMMITTED and delivered (None: nothing compacted)."""
        with self._db.transaction() as cur:
            cur.execute(
                "SELECT compacted_through FROM twophase_sinks WHERE sink_id = %s", (sink_id,)
            )
            row = cur.fetchone()
            return None if row is None else row[0]

    def epoch_bounds(self, sink_id: str) -> tuple[int, int | None, int | None]:
        """How many epochs the sink has recorded, the lowest and the highest."""
        with self._db.transaction() as cur:
            cur.execute(
                "SELECT count(*), min(epoch), max(epoch) FROM twophase_epochs WHERE sink_id = %s",
                (sink_id,),
            )
            row = cur.fetchone()
            return (int(row[0]), row[1], row[2]) if row else (0, None, None)

    def sinks_with_data(self) -> list[str]:
        """Sinks with a row or with staged writes (a write may outlive its sink's row)."""
        with self._db.transaction() as cur:
            cur.execute(
                "SELECT sink_id FROM twophase_sinks UNION SELECT DISTINCT sink_id"
                " FROM twophase_writes ORDER BY sink_id"
            )
            return [row[0] for row in cur.fetchall()]

    def events(self, sink_id: str, epoch: int) -> list[EpochEvent]:
        with self._db.transaction() as cur:
            cur.execute(
                "SELECT at, event, run_id, detail FROM twophase_epoch_events"
                " WHERE sink_id = %s AND epoch = %s ORDER BY id",
                (sink_id, epoch),
            )
            return [EpochEvent(*row) for row in cur.fetchall()]

    def last_event_id(self) -> int:
        """The id of the newest event of any epoch (0: none): what came later is newer."""
        with self._db.transaction() as cur:
            cur.execute("SELECT COALESCE(max(id), 0) FROM twophase_epoch_events")
            row = cur.fetchone()
            return int(row[0]) if row else 0

    def target_skips(self, sink_id: str, target: str, after_id: int) -> list[int]:
        """The epochs a catch-up skipped for ``target`` because GC had purged them (its
        ``target_skipped`` events newer than ``after_id``), in order."""
        with self._db.transaction() as cur:
            cur.execute(
                "SELECT DISTINCT epoch FROM twophase_epoch_events WHERE sink_id = %(s)s"
                " AND event = 'target_skipped' AND id > %(after)s AND epoch IS NOT NULL"
                " AND left(detail, length(%(p)s)) = %(p)s ORDER BY epoch",
                {"s": sink_id, "after": after_id, "p": f"{target}: "},
            )
            return [int(row[0]) for row in cur.fetchall()]

    def has_targets(self) -> bool:
        """Whether the store keeps per-target state (revision 0007_targets on)."""
        with self._db.transaction() as cur:
            cur.execute("SELECT to_regclass('twophase_targets') IS NOT NULL")
            row = cur.fetchone()
            return bool(row and row[0])

    def count_dead_letters(self, sink_id: str, epoch: int | None) -> int:
        with self._db.transaction() as cur:
            cur.execute(
                f"SELECT count(*) {_DECIDED_DEAD_LETTERS}"  # constant text, no user data
                " AND (%s::bigint IS NULL OR d.epoch = %s)",
                (sink_id, epoch, epoch),
            )
            row = cur.fetchone()
            return int(row[0]) if row else 0

    def orphan_dead_letters(self, sink_id: str) -> int:
        """The sink's dead letters of writes no decision chose (orphans' copies, which
        GC removes with their writes)."""
        with self._db.transaction() as cur:
            cur.execute(
                f"SELECT count(*) FROM twophase_dead_letters d WHERE d.sink_id = %s"  # noqa: S608
                f" AND NOT {DECIDED_LETTER}",  # constant text, no user data
                (sink_id,),
            )
            row = cur.fetchone()
            return int(row[0]) if row else 0

    def dead_letters(
        self, sink_id: str, epoch: int | None, limit: int | None = None
    ) -> Iterator[DeadLetter]:
        """In (epoch, id) order, a page at a time: bounded memory for exports.

        Each page is one short transaction, the next one starting past the last row
        given (keyset pagination): a consumer as slow as it likes holds no
        transaction between pages, so the store's idle limit never ends the read.
        A letter added meanwhile past the last row given is read too; one behind it
        is not (the rows of a page are those committed when it was read)."""
        after: tuple[int, int] | None = None
        left = limit
        while left is None or left > 0:
            size = _LETTER_PAGE if left is None else min(left, _LETTER_PAGE)
            page = self._letter_page(sink_id, epoch, after, size)
            yield from page
            if len(page) < size:
                return
            after = (page[-1].epoch, page[-1].id or 0)
            left = None if left is None else left - len(page)

    def _letter_page(
        self, sink_id: str, epoch: int | None, after: tuple[int, int] | None, size: int
    ) -> list[DeadLetter]:
        first = after is None
        with self._db.transaction() as cur:
            cur.execute(
                "SELECT d.sink_id, d.epoch, d.write_id::text, d.seq, d.phase, d.reason,"
                " d.payload, d.id, d.created_at, d.requeued_in,"
                f" d.target {_DECIDED_DEAD_LETTERS}"  # constant
                " AND (%s::bigint IS NULL OR d.epoch = %s)"
                " AND (%s OR (d.epoch, d.id) > (%s::bigint, %s::bigint))"
                " ORDER BY d.epoch, d.id LIMIT %s",
                (sink_id, epoch, epoch, first, *(after or (0, 0)), size),
            )
            return [
                DeadLetter(sink, number, write, seq, Phase(phase), *rest)
                for sink, number, write, seq, phase, *rest in cur.fetchall()
            ]


def _sink_status(row: Sequence[Any]) -> SinkStatus:
    """A status row; ``owner_live`` is derived from the owner's state (column 3)."""
    values = list(row)
    values.insert(3, row[3] == "live")
    return SinkStatus(*values)


def _epoch_info(row: Sequence[Any]) -> EpochInfo:
    sink_id, epoch, state, *rest = row
    return EpochInfo(sink_id, epoch, EpochState(state), *rest)
