"""Phase 1: stage an epoch's points into PostgreSQL (executor side), and read them back.

A *write* is one task attempt's output for one epoch. :meth:`Stager.stage`
COPYs its lines and its dead letters and records the write, all in one
transaction, and returns a :class:`CommitMessage` for the driver's vote.
Nothing reaches InfluxDB here.

Idempotency: every call makes a new write (fresh ``write_id``); a retried task
stages again under a new id and only the write ids named by the decision
count. Unchosen writes are orphans: :meth:`discard` or GC removes them.
"""

from __future__ import annotations

import hashlib
import pickle
import tempfile
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

import psycopg

from twophase.db import Database
from twophase.faults import crash_point

if TYPE_CHECKING:
    from twophase.points import Rejected

STAGE = "stage"
PROMOTE = "promote"
_CRASH_EVERY = 50  # rows between two checks of the mid-COPY crash point (a dict lookup)


@dataclass(frozen=True)
class CommitMessage:
    """What a task tells the driver about its write (picklable; Spark ships it)."""

    sink_id: str
    epoch: int
    write_id: str
    partition_id: int
    attempt: int
    points: int
    rejected: int
    checksum: str
    run_id: str | None = None
    query_id: str | None = None


@dataclass(frozen=True)
class DeadLetter:
    """One row or point that cannot be delivered, and why."""

    sink_id: str
    epoch: int
    write_id: str
    seq: int
    phase: str
    reason: str
    payload: str


class LineChecksum:
    """Order-sensitive digest of a write's lines; staging and promotion must agree (I1)."""

    def __init__(self) -> None:
        self._hash = hashlib.blake2b(digest_size=16)

    def add(self, line: str) -> None:
        self._hash.update(line.encode("utf-8"))
        self._hash.update(b"\n")

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


class Stager:
    """Executor side of phase 1. One role: turn converted rows into a staged write."""

    def __init__(self, db: Database):
        self._db = db

    def stage(
        self,
        sink_id: str,
        epoch: int,
        items: Iterable[str | Rejected],
        *,
        partition_id: int = 0,
        attempt: int = 0,
        run_id: str | None = None,
        query_id: str | None = None,
    ) -> CommitMessage:
        """COPY ``items`` (lines, or rows rejected at conversion) as one new write.

        All or nothing: the lines, the dead letters and the write record commit
        in one transaction. ``items`` is consumed lazily (bounded memory).
        """
        write_id = uuid.uuid4()
        checksum = LineChecksum()
        with tempfile.TemporaryFile() as spool, self._db.transaction() as cur:
            with cur.copy("COPY twophase_staged_points (write_id, seq, line) FROM STDIN") as copy:
                points, rejected = 0, 0
                for item in items:
                    if isinstance(item, str):
                        copy.write_row((write_id, points, item))
                        checksum.add(item)
                        points += 1
                        if points % _CRASH_EVERY == 0:
                            crash_point("stage_rows")
                    else:
                        pickle.dump(item, spool)
                        rejected += 1
            if rejected:
                _copy_rejects(cur, sink_id, epoch, write_id, spool)
            cur.execute(
                "INSERT INTO twophase_writes (write_id, sink_id, epoch, run_id, partition_id,"
                " attempt, points, rejected, checksum) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    write_id,
                    sink_id,
                    epoch,
                    run_id,
                    partition_id,
                    attempt,
                    points,
                    rejected,
                    checksum.hexdigest(),
                ),
            )
        crash_point("after_stage")
        return CommitMessage(
            sink_id=sink_id,
            epoch=epoch,
            write_id=str(write_id),
            partition_id=partition_id,
            attempt=attempt,
            points=points,
            rejected=rejected,
            checksum=checksum.hexdigest(),
            run_id=run_id,
            query_id=query_id,
        )

    def discard(self, write_ids: Sequence[str]) -> int:
        """Delete writes that no decided epoch names (task failure, Spark ``abort``).

        Idempotent; a write chosen by a decision is never touched (I1). Returns
        how many writes were removed.
        """
        ids = [uuid.UUID(w) for w in write_ids]
        if not ids:
            return 0
        with self._db.transaction() as cur:
            lock_sinks_of_writes(cur, ids)
            return len(delete_unchosen_writes(cur, ids))


def lock_sinks_of_writes(cur: psycopg.Cursor[Any], ids: list[uuid.UUID]) -> None:
    """Lock the sink rows of these writes, as decide() does, so that a concurrent
    decision cannot choose a write while it is being deleted."""
    cur.execute(
        "SELECT sink_id FROM twophase_sinks WHERE sink_id IN (SELECT DISTINCT sink_id"
        " FROM twophase_writes WHERE write_id = ANY(%s)) ORDER BY sink_id FOR UPDATE",
        (ids,),
    )


def delete_unchosen_writes(cur: psycopg.Cursor[Any], ids: list[uuid.UUID]) -> list[uuid.UUID]:
    """Remove the given writes, their lines and dead letters, unless a decision names them."""
    cur.execute(
        "DELETE FROM twophase_writes w WHERE w.write_id = ANY(%s) AND NOT EXISTS ("
        " SELECT 1 FROM twophase_epochs e WHERE e.sink_id = w.sink_id AND e.epoch = w.epoch"
        " AND w.write_id = ANY(e.write_ids)) RETURNING w.write_id",
        (ids,),
    )
    gone = [row[0] for row in cur.fetchall()]
    if gone:
        cur.execute("DELETE FROM twophase_staged_points WHERE write_id = ANY(%s)", (gone,))
        cur.execute("DELETE FROM twophase_dead_letters WHERE write_id = ANY(%s)", (gone,))
    return gone


def _spooled(spool: IO[bytes]) -> Iterator[Rejected]:
    spool.seek(0)
    while True:
        try:
            yield pickle.load(spool)
        except EOFError:
            return


def _copy_rejects(
    cur: psycopg.Cursor[Any], sink_id: str, epoch: int, write_id: uuid.UUID, spool: IO[bytes]
) -> None:
    sql = (
        "COPY twophase_dead_letters (sink_id, epoch, write_id, seq, phase, reason, payload)"
        " FROM STDIN"
    )
    with cur.copy(sql) as copy:
        for rej in _spooled(spool):
            copy.write_row((sink_id, epoch, write_id, rej.index, STAGE, rej.reason, rej.payload))


class StagedReader:
    """Reads staged lines back for promotion, and records promote-time dead letters."""

    def __init__(self, db: Database, fetch_size: int = 5000):
        self._db = db
        self._fetch_size = fetch_size

    def lines(self, write_id: str) -> Iterator[tuple[int, str]]:
        """``(seq, line)`` of one write in seq order, through a server-side cursor.

        Deterministic order and bounded memory: at most ``fetch_size`` rows are
        held at a time. Holds one pooled connection until exhausted or closed.
        """
        with self._db.connection() as conn, conn.transaction():
            name = f"twophase_promote_{uuid.UUID(write_id).hex}"
            with conn.cursor(name=name) as cur:
                cur.itersize = self._fetch_size
                cur.execute(
                    "SELECT seq, line FROM twophase_staged_points WHERE write_id = %s ORDER BY seq",
                    (uuid.UUID(write_id),),
                )
                yield from cur

    def add_dead_letters(self, letters: Sequence[DeadLetter]) -> None:
        """Record dead letters; idempotent (a re-promotion records each one once)."""
        if not letters:
            return
        with self._db.transaction() as cur:
            cur.executemany(
                "INSERT INTO twophase_dead_letters (sink_id, epoch, write_id, seq, phase, reason,"
                " payload) VALUES (%s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (write_id, phase, seq) DO NOTHING",
                [
                    (d.sink_id, d.epoch, uuid.UUID(d.write_id), d.seq, d.phase, d.reason, d.payload)
                    for d in letters
                ],
            )
