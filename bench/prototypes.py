"""Prototypes of proposed core changes, used only by ``bench/experiments.py``.

Each keeps the protocol's contracts (same staged rows and checksums, same
ledger calls in the same order, same dead letters) and changes only how the
work is done:

* :class:`FastStager`: COPY text built per chunk of lines in C-speed string
  operations instead of ``Copy.write_row`` per line; the checksum is one
  ``blake2b.update`` per chunk (equal to the core's per-line updates, since
  ``update(a); update(b) == update(a + b)``).
* :class:`PrefetchPromoter`: a reader thread fetches the next chunk of staged
  lines from PostgreSQL (``fetchmany``) while the current one is being sent
  to InfluxDB; checksum per chunk; no second batching pass. With
  ``writers > 1`` each chunk is split by series key over several HTTP
  connections (per-series order kept, so the last write of a duplicated
  point is still the same one).
* :class:`PipelinedCommitter`: decide epoch N, promote it in the background
  while the caller stages N+1 (one epoch in flight, order kept).
* :class:`ChunkStager` / :class:`ChunkPromoter`: lines staged as chunks of
  line protocol (one row per ~5,000 lines, with the line boundaries) in a
  bench-only table ``bench_staged_chunks``; promotion sends each chunk's body
  as it is, and falls back to the core's per-line path only when InfluxDB
  refuses the body (400/413), to isolate the bad lines.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import queue
import re
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from twophase.committer import Committer, Promoter, PromoteResult
from twophase.db import Database
from twophase.errors import InfluxUnavailableError, PermanentError, TwoPhaseError
from twophase.influx import BadPointsError, BatchTooLargeError, InfluxWriter
from twophase.ledger import EpochPlan, Lease, Ledger
from twophase.points import Rejected
from twophase.schema import PRECOMMITTED
from twophase.sender import BatchSender, RetryPolicy
from twophase.staging import PROMOTE, CommitMessage, DeadLetter, StagedReader, Stager

CHUNK = 5000
_COPY_SPECIAL = ("\\", "\t", "\n", "\r")
_SERIES_KEY = re.compile(r"(?:[^ \\]|\\.)*")


def checksum_of(lines: Sequence[str]) -> bytes:
    """What :class:`twophase.staging.LineChecksum` hashes for ``lines``: each line + newline."""
    return ("\n".join(lines) + "\n").encode("utf-8") if lines else b""


def copy_escaped(lines: list[str]) -> list[str]:
    """The lines escaped for COPY's text format (backslash, tab, newline, CR)."""
    joined = "\x00".join(lines)
    if not any(c in joined for c in _COPY_SPECIAL):
        return lines
    if joined.count("\x00") != len(lines) - 1:
        raise PermanentError("a staged line contains NUL, which PostgreSQL text cannot hold")
    joined = joined.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
    return joined.replace("\r", "\\r").split("\x00")


def _chunks(items: Iterable[str | Rejected], size: int) -> Iterator[list[str | Rejected]]:
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


class FastStager(Stager):
    """:meth:`stage` with the core's contract and rows, built in chunks (no rejects path)."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._db_ = db

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
        write_id = uuid.uuid4()
        digest = hashlib.blake2b(digest_size=16)
        points = 0
        with self._db_.transaction() as cur:
            with cur.copy("COPY twophase_staged_points (write_id, seq, line) FROM STDIN") as copy:
                prefix = f"{write_id}\t"
                for chunk in _chunks(items, CHUNK):
                    lines = [item for item in chunk if isinstance(item, str)]
                    if len(lines) != len(chunk):
                        raise NotImplementedError("prototype: rejected rows not handled")
                    digest.update(checksum_of(lines))
                    escaped = copy_escaped(lines)
                    copy.write(
                        "".join([f"{prefix}{points + i}\t{x}\n" for i, x in enumerate(escaped)])
                    )
                    points += len(lines)
            cur.execute(
                "INSERT INTO twophase_writes (write_id, sink_id, epoch, run_id, partition_id,"
                " attempt, points, rejected, checksum) VALUES (%s, %s, %s, %s, %s, %s, %s, 0, %s)",
                (
                    write_id,
                    sink_id,
                    epoch,
                    run_id,
                    partition_id,
                    attempt,
                    points,
                    digest.hexdigest(),
                ),
            )
        return CommitMessage(
            sink_id, epoch, str(write_id), partition_id, attempt, points, 0, digest.hexdigest(),
            run_id, query_id,
        )  # fmt: skip


class _PlanPromoter(Promoter):
    """``promote`` as the core does it (plan, send, record error or mark); ``_send_plan`` varies."""

    def __init__(self, ledger: Ledger, reader: StagedReader, sender: BatchSender) -> None:
        super().__init__(ledger, reader, sender)
        self._ledger_, self._reader_, self._sender_ = ledger, reader, sender

    def promote(self, lease: Lease, epoch: int) -> PromoteResult:
        plan = self._ledger_.plan_promotion(lease, epoch)
        try:
            delivered, rejected = self._send_plan(plan)
        except TwoPhaseError as exc:
            self._ledger_.record_error(lease.sink_id, epoch, f"{type(exc).__name__}: {exc}")
            raise
        self._ledger_.mark_committed(lease, epoch, delivered, rejected)
        return PromoteResult(lease.sink_id, epoch, delivered, rejected)

    def _send_plan(self, plan: EpochPlan) -> tuple[int, int]:
        raise NotImplementedError

    def _dead_letters(
        self, plan: EpochPlan, index: int, seqs: Sequence[int], lines: Sequence[str],
        rejects: Sequence[tuple[int, str]],
    ) -> int:  # fmt: skip
        letters = [
            DeadLetter(plan.sink_id, plan.epoch, plan.writes[index].write_id, seqs[i], PROMOTE,
                       f"InfluxDB rejected the point: {why}", lines[i])
            for i, why in rejects
        ]  # fmt: skip
        self._reader_.add_dead_letters(letters)
        return len(letters)


def _check(plan: EpochPlan, digests: list[Any], counts: list[int]) -> None:
    for write, digest, count in zip(plan.writes, digests, counts, strict=True):
        if count != write.points or digest.hexdigest() != write.checksum:
            raise PermanentError(f"epoch {plan.epoch}: write {write.write_id} changed")


_DONE = object()


LINES_SQL = "SELECT seq, line FROM twophase_staged_points WHERE write_id = %s ORDER BY seq"
CHUNKS_SQL = (
    "SELECT first_seq, ends, body FROM bench_staged_chunks WHERE write_id = %s ORDER BY chunk"
)


class _Prefetch:
    """A thread reading each write's rows ahead, ``fetch`` at a time, into a bounded queue.

    Yields ``(write index, rows)``. Memory stays bounded by ``depth * fetch`` rows.
    """

    def __init__(self, db: Database, plan: EpochPlan, sql: str, fetch: int, depth: int = 3):
        self._db, self._plan, self._sql, self._fetch = db, plan, sql, fetch
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="twophase-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for index, write in enumerate(self._plan.writes):
                self._read_write(index, write.write_id)
            self._queue.put(_DONE)
        except BaseException as exc:  # handed to the consumer, raised there
            self._queue.put(exc)

    def _read_write(self, index: int, write_id: str) -> None:
        name = f"twophase_prefetch_{uuid.UUID(write_id).hex}"
        with self._db.connection() as conn, conn.transaction(), conn.cursor(name=name) as cur:
            cur.execute(self._sql, (uuid.UUID(write_id),))
            while not self._stop.is_set() and (rows := cur.fetchmany(self._fetch)):
                self._queue.put((index, rows))

    def __iter__(self) -> Iterator[tuple[int, list[Any]]]:
        try:
            while (item := self._queue.get()) is not _DONE:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self._stop.set()
            while self._thread.is_alive():  # unblock a reader waiting on a full queue
                with contextlib.suppress(queue.Empty):
                    self._queue.get(timeout=0.05)


class PrefetchPromoter(_PlanPromoter):
    """Reads ahead in a thread; sends each chunk through ``writers`` connections by series."""

    def __init__(
        self, ledger: Ledger, reader: StagedReader, db: Database, senders: Sequence[BatchSender]
    ) -> None:
        super().__init__(ledger, reader, senders[0])
        self._db_, self._senders = db, list(senders)
        self._pool = ThreadPoolExecutor(len(senders)) if len(senders) > 1 else None

    def _send_plan(self, plan: EpochPlan) -> tuple[int, int]:
        digests = [hashlib.blake2b(digest_size=16) for _ in plan.writes]
        counts = [0] * len(plan.writes)
        delivered = rejected = 0
        for index, rows in _Prefetch(self._db_, plan, LINES_SQL, CHUNK):
            seqs, lines = [row[0] for row in rows], [row[1] for row in rows]
            rejects = self._send_chunk(lines)
            rejected += self._dead_letters(plan, index, seqs, lines, rejects)
            delivered += len(lines) - len(rejects)
            digests[index].update(checksum_of(lines))
            counts[index] += len(lines)
        _check(plan, digests, counts)
        return delivered, rejected

    def _send_chunk(self, lines: list[str]) -> list[tuple[int, str]]:
        if self._pool is None:
            return self._senders[0].send(lines)
        parts = _by_series(lines, len(self._senders))
        futures = [
            self._pool.submit(sender.send, [lines[i] for i in part])
            for sender, part in zip(self._senders, parts, strict=True)
        ]
        rejects: list[tuple[int, str]] = []
        for part, future in zip(parts, futures, strict=True):
            rejects += [(part[i], why) for i, why in future.result()]
        return sorted(rejects)


def _by_series(lines: list[str], ways: int) -> list[list[int]]:
    """Indexes of ``lines`` split ``ways`` ways by series key (order kept within a part)."""
    parts: list[list[int]] = [[] for _ in range(ways)]
    match = _SERIES_KEY.match
    for i, text in enumerate(lines):
        found = match(text)
        parts[hash(found.group() if found else text) % ways].append(i)
    return parts


CHUNK_TABLE = (
    "CREATE TABLE IF NOT EXISTS bench_staged_chunks (write_id uuid NOT NULL, chunk integer"
    " NOT NULL, first_seq integer NOT NULL, ends integer[] NOT NULL, body text NOT NULL,"
    " PRIMARY KEY (write_id, chunk));"
    " ALTER TABLE bench_staged_chunks ALTER COLUMN body SET STORAGE EXTERNAL"
)  # EXTERNAL: no pglz compression (it halved COPY speed); the rows are as big as today's


class ChunkStager(FastStager):
    """Stages chunks of line protocol: one row per ``CHUNK`` lines, with the line ends."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        with db.transaction() as cur:
            cur.execute(CHUNK_TABLE)

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
        write_id = uuid.uuid4()
        digest = hashlib.blake2b(digest_size=16)
        points = 0
        with self._db_.transaction() as cur:
            sql = "COPY bench_staged_chunks (write_id, chunk, first_seq, ends, body) FROM STDIN"
            with cur.copy(sql) as copy:
                for number, chunk in enumerate(_chunks(items, CHUNK)):
                    lines = [item for item in chunk if isinstance(item, str)]
                    if len(lines) != len(chunk):
                        raise NotImplementedError("prototype: rejected rows not handled")
                    body = "\n".join(lines)
                    digest.update((body + "\n").encode("utf-8"))
                    ends = ",".join(map(str, itertools.accumulate(len(x) + 1 for x in lines)))
                    text = copy_escaped([body])[0]
                    copy.write(f"{write_id}\t{number}\t{points}\t{{{ends}}}\t{text}\n")
                    points += len(lines)
            cur.execute(
                "INSERT INTO twophase_writes (write_id, sink_id, epoch, run_id, partition_id,"
                " attempt, points, rejected, checksum) VALUES (%s, %s, %s, %s, %s, %s, %s, 0, %s)",
                (
                    write_id,
                    sink_id,
                    epoch,
                    run_id,
                    partition_id,
                    attempt,
                    points,
                    digest.hexdigest(),
                ),
            )
        return CommitMessage(
            sink_id, epoch, str(write_id), partition_id, attempt, points, 0, digest.hexdigest(),
            run_id, query_id,
        )  # fmt: skip


class ChunkPromoter(_PlanPromoter):
    """Sends each staged chunk's body as one request; per-line fallback on 400/413."""

    def __init__(
        self, ledger: Ledger, reader: StagedReader, db: Database, sender: BatchSender,
        writer: InfluxWriter, policy: RetryPolicy,
    ) -> None:  # fmt: skip
        super().__init__(ledger, reader, sender)
        self._db_, self._writer, self._policy = db, writer, policy

    def _send_plan(self, plan: EpochPlan) -> tuple[int, int]:
        digests = [hashlib.blake2b(digest_size=16) for _ in plan.writes]
        counts = [0] * len(plan.writes)
        delivered = rejected = 0
        for index, rows in _Prefetch(self._db_, plan, CHUNKS_SQL, 1):
            for first, ends, body in rows:
                data = body.encode("utf-8")
                rejects = self._send_body(data, body, ends)
                seqs = range(first, first + len(ends))
                if rejects:
                    rejected += self._dead_letters(plan, index, seqs, _split(body, ends), rejects)
                delivered += len(ends) - len(rejects)
                digests[index].update(data + b"\n")
                counts[index] += len(ends)
        _check(plan, digests, counts)
        return delivered, rejected

    def _send_body(self, data: bytes, body: str, ends: list[int]) -> list[tuple[int, str]]:
        """One request for the whole chunk; the core's per-line path when it is refused."""
        try:
            self._write_with_retry(data)
        except (BadPointsError, BatchTooLargeError):
            return self._sender_.send(_split(body, ends))
        return []

    def _write_with_retry(self, data: bytes) -> None:
        deadline = time.monotonic() + self._policy.deadline_s
        for attempt in itertools.count(1):
            try:
                self._writer.write(data)
                return
            except InfluxUnavailableError as exc:
                delay = self._policy.delay(attempt, getattr(exc, "retry_after", None))
                if time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)


def _split(body: str, ends: list[int]) -> list[str]:
    starts = [0, *ends[:-1]]
    return [body[s : e - 1] for s, e in zip(starts, ends, strict=True)]


class PipelinedCommitter:
    """Promotes epoch N in a background thread while the caller stages N+1.

    ``commit(N)``: wait for N-1's promotion (raising its error), recover any
    other PRECOMMITTED epoch (I3), decide N (durable before returning), start
    promoting N, return. At most one epoch is in flight, always the newest
    decided one, so epochs are still promoted in order; a failed promotion
    surfaces on the next ``commit`` (or ``flush``) and its epoch stays
    PRECOMMITTED for recovery, as today.
    """

    def __init__(self, committer: Committer, ledger: Ledger, promoter: Promoter) -> None:
        self._committer, self._ledger, self._promoter = committer, ledger, promoter
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="twophase-promote")
        self._pending: Future[PromoteResult] | None = None

    def commit(self, lease: Lease, epoch: int, messages: Sequence[CommitMessage]) -> None:
        self.flush()
        self._committer.recover(lease)
        decision = self._ledger.decide(lease, epoch, messages)
        if decision.state == PRECOMMITTED:
            self._pending = self._executor.submit(self._promoter.promote, lease, epoch)

    def flush(self) -> PromoteResult | None:
        pending, self._pending = self._pending, None
        return pending.result() if pending is not None else None

    def close(self) -> None:
        self.flush()
        self._executor.shutdown()
