"""Driver side: reading decided epochs back from the staging store, in promotion order.

[`decided_writes`][twophase.protocol.deliver.reader.decided_writes] is the one place where the order
of an epoch's writes is written down. Promotion, resend and verify all read an epoch through
it, so they send (or rebuild) its points in the same order every time (I4: two writes of the
same point within an epoch always land in the same order). Within a write, lines keep their
staged order (seq).

Read-only: nothing here changes the store.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Generator, Iterator, Sequence
from typing import Any

import psycopg

from twophase.model import CommitMessage, EpochPlan, EpochState, Phase, StagedChunk, WriteRef
from twophase.store.database import Database

Cursor = psycopg.Cursor[Any]

# The promotion order of an epoch's writes: by the partition that staged them, then id.
_DECIDED_WRITES = (
    "SELECT w.write_id::text, w.points, w.checksum FROM twophase_epochs e"
    " JOIN twophase_writes w ON w.write_id = ANY(e.write_ids)"
    " WHERE e.sink_id = %s AND e.epoch = %s ORDER BY w.partition_id, w.write_id"
)

_PARTITION_WRITES = (
    "SELECT DISTINCT ON (partition_id) write_id, partition_id, attempt, points, rejected,"
    " checksum FROM twophase_writes WHERE sink_id = %s AND epoch = %s AND run_id = %s"
    " ORDER BY partition_id, attempt, staged_at, write_id"
)

# Ordered by the writes' positions in the plan, then by chunk: an index scan per write.
_CHUNKS_OF_WRITES = (
    "SELECT w.position, c.first_seq, c.points, c.ends, c.body, c.lane, c.body_gz, c.checksum"
    " FROM unnest(%s::uuid[]) WITH ORDINALITY AS w(write_id, position)"
    " JOIN twophase_staged_chunks c ON c.write_id = w.write_id"
    " ORDER BY w.position, c.chunk"
)


# Refused lines, less those a correction delivered: requeued, while no correction is
# pending and no dead letter of the same line is left unrequeued (refused again, or
# given back by an aborted correction).
# Only the letters of the target asked about, and those naming none (from before targets
# were named).
_STILL_REFUSED = (
    "SELECT d.write_id::text, d.seq FROM twophase_dead_letters d"
    " WHERE d.sink_id = %(sink)s AND d.epoch = ANY(%(epochs)s) AND d.phase = %(phase)s"
    " AND d.target IN ('', %(target)s)"
    " AND NOT (d.requeued_in IS NOT NULL"
    " AND NOT EXISTS (SELECT 1 FROM twophase_dead_letters x WHERE x.sink_id = d.sink_id"
    "   AND x.phase = d.phase AND x.payload = d.payload AND x.requeued_in IS NULL"
    "   AND x.target = d.target)"
    " AND NOT EXISTS (SELECT 1 FROM twophase_epochs c WHERE c.sink_id = d.sink_id"
    "   AND c.epoch < 0 AND c.state = %(pending)s))"
)


def decided_writes(cur: Cursor, sink_id: str, epoch: int) -> tuple[WriteRef, ...]:
    """The writes the epoch's decision chose, in promotion order (inside ``cur``'s
    transaction, so that a caller holding a lock on the epoch reads them under it)."""
    cur.execute(_DECIDED_WRITES, (sink_id, epoch))
    return tuple(WriteRef(w, p, c) for w, p, c in cur.fetchall())


class StagedReader:
    """Reads decided epochs' staged lines, and their promote-time dead letters."""

    def __init__(self, db: Database, fetch_chunks: int = 2):
        self._db = db
        self._fetch_chunks = fetch_chunks

    def plan(self, sink_id: str, epoch: int) -> EpochPlan:
        """The epoch's decided writes in promotion order (empty when it is not recorded)."""
        with self._db.transaction() as cur:
            return EpochPlan(sink_id, epoch, decided_writes(cur, sink_id, epoch))

    def chunks_of(
        self, write_ids: Sequence[str], *, small: bool = False
    ) -> Generator[tuple[int, StagedChunk], None, None]:
        """Every chunk of these writes as ``(index in write_ids, chunk)``, in that
        order and then in seq order, in one query.

        One query and one transaction for a whole epoch, however many tasks
        staged it (a cursor per write cost a transaction per task). Through a
        server-side cursor, memory is bounded: at most ``fetch_chunks`` chunks
        are held at a time, and one pooled connection is held until exhausted
        or closed. ``small`` (the caller knows the chunks fit in memory: an
        epoch within one request) reads them at once, saving the cursor's
        round trips. A chunk whose lines do not fit its body raises
        PermanentError. A compressed chunk comes as stored (its gzip member),
        decompressed only if its lines are asked for.
        """
        ids = [uuid.UUID(w) for w in write_ids]
        rows: Generator[tuple[Any, ...], None, None]
        if small:
            with self._db.transaction() as cur:
                cur.execute(_CHUNKS_OF_WRITES, (ids,), binary=True)
                fetched = cur.fetchall()
            rows = (row for row in fetched)
        else:
            rows = self._cursor(ids)
        with contextlib.closing(rows) as each:  # a damaged chunk: the cursor closed at once
            for position, first_seq, points, ends, body, lane, gz, checksum in each:
                write_id = write_ids[position - 1]
                chunk = StagedChunk(write_id, first_seq, points, ends, body, lane, gz, checksum)
                yield position - 1, chunk.check()

    def _cursor(self, ids: list[uuid.UUID]) -> Generator[tuple[Any, ...], None, None]:
        with self._db.connection() as conn, conn.transaction():
            # The one transaction left open between statements: its consumer sends to a
            # target between fetches, for up to the target's retry deadline. It holds a
            # snapshot and share locks, which no run's step waits for (only DDL), so it
            # is spared the idle limit that ends a frozen session's row locks.
            conn.execute("SET LOCAL idle_in_transaction_session_timeout = 0")
            name = f"twophase_promote_{uuid.uuid4().hex}"
            with conn.cursor(name=name, binary=True) as cur:
                cur.itersize = self._fetch_chunks
                cur.execute(_CHUNKS_OF_WRITES, (ids,))
                yield from cur

    def lines(self, plan: EpochPlan) -> Iterator[tuple[str, int, str]]:
        """``(write_id, seq, line)`` of every line of the plan, in promotion order."""
        for _, chunk in self.chunks_of([w.write_id for w in plan.writes]):
            for seq, line in enumerate(chunk.lines(), chunk.first_seq):
                yield chunk.write_id, seq, line

    def partition_writes(
        self, sink_id: str, epoch: int, run_id: str, query_id: str | None
    ) -> list[CommitMessage]:
        """The commit messages of the writes ``run_id`` staged for an epoch, one per
        partition, for a decision when no task result carries them (dead letters
        split off upstream of a sink: see
        [`twophase.spark.dead_letter_split`][twophase.spark.dead_letter_split]).

        Every attempt of a partition's task stages the same rows (Spark re-reads
        the same input split), and staging is all or nothing, so any complete
        write stands for its partition: the first attempt's, then the oldest.
        Writes of other runs (a crashed driver's) are never chosen.
        """
        store = self._db.config.display_url

        def read() -> list[CommitMessage]:
            with self._db.transaction() as cur:
                cur.execute(_PARTITION_WRITES, (sink_id, epoch, run_id))
                return [
                    CommitMessage(sink_id, epoch, str(w), p, a, n, r, c, run_id, query_id, store)
                    for w, p, a, n, r, c in cur.fetchall()
                ]

        return self._db.retry("read split-off writes", read)

    def rejected_at_promote(
        self, sink_id: str, epochs: Sequence[int], target: str = ""
    ) -> set[tuple[str, int]]:
        """(write_id, seq) of the staged lines the target (``target``, of several) refused
        and still does not hold: a line requeued and delivered by a committed correction
        is not among them."""
        with self._db.transaction() as cur:
            cur.execute(
                _STILL_REFUSED,
                {
                    "sink": sink_id,
                    "epochs": list(epochs),
                    "phase": Phase.PROMOTE,
                    "pending": EpochState.PRECOMMITTED,
                    "target": target,
                },
            )
            return {(w, s) for w, s in cur.fetchall()}
