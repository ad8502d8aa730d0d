"""Phase 1, executor side: stage one task's points into PostgreSQL as one write.

A *write* is one staging call's output for one epoch.
[`Stager.stage`][twophase.protocol.stage.stager.Stager.stage]
COPYs its lines (in chunks: see [`StagedChunk`][twophase.model.StagedChunk]) and its
stage-time dead letters and records the write, all in one transaction, and
returns a [`CommitMessage`][twophase.model.CommitMessage] for the driver's vote.
Nothing reaches a target here.

Idempotency: every call makes a new write (fresh ``write_id``); a retried task
stages again under a new id and only the write ids named by the decision
count (I1). Unchosen writes are orphans, which GC removes.

Repeats: a transaction that the staging store's outage cuts (mid-COPY, or at
COMMIT) is repeated by the same call under the same write id, until
``staging_retry_deadline``. The call's input is read once: what it encodes --
the chunks, whose timestamps are then fixed (I8), and the rejected rows -- is
kept as it goes in a spool ([`twophase.protocol.stage.spool`][twophase.protocol.stage.spool]: memory
up to ``staging_spool_memory``, then a temporary file), and a repeat COPYs the spool
before it reads on. An input already in memory (a list or tuple) is encoded
again instead. A repeat first reads back whether the cut attempt committed:
the write's row, chunks and dead letters commit together, so a
``twophase_writes`` row with the write id means they all landed, and its
message is returned rather than the write staged twice.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import psycopg

from twophase.config import GZIP, StagingConfig
from twophase.faults import crash_point
from twophase.logs import fields
from twophase.model import (
    MAX_LINE_BYTES,
    CommitMessage,
    LineChecksum,
    Phase,
    StagedChunk,
    check_sink_id,
    chunk_digest,
)
from twophase.points.batching import batches
from twophase.points.builder import Rejected, cut_payload
from twophase.protocol.stage.lanes import LaneChooser
from twophase.protocol.stage.spool import Spool
from twophase.store.database import Database

log = logging.getLogger("twophase.protocol.stager")
_CRASH_EVERY = 50  # lines between two checks of the mid-COPY crash point (cheap, unarmed)
# The spool's parts, and what it counts for the memory of a rejected row and of one
# entry of a chunk's ``ends`` (an int object and its pointer) beside their texts.
_CHUNKS, _REJECTS = "chunks", "rejects"
_REJECT_BYTES = 200
_END_BYTES = 36
# Characters past which a line may be longer than MAX_LINE_BYTES of UTF-8 (4 bytes each
# at most): only such a line is encoded to be measured.
_LONG_CHARS = MAX_LINE_BYTES // 4
T = TypeVar("T")


@dataclass(frozen=True)
class _Shape:
    """How lines are cut into chunks: see [`Stager`][twophase.protocol.stage.stager.Stager]."""

    chunk_points: int
    chunk_chars: int
    lanes: int
    compressed: bool


@dataclass(frozen=True)
class _Write:
    """One staging call's write: its id, fixed for all its attempts, and its task."""

    sink_id: str
    epoch: int
    write_id: uuid.UUID
    partition_id: int
    attempt: int
    run_id: str | None
    query_id: str | None

    def message(self, points: int, rejected: int, checksum: str, store: str) -> CommitMessage:
        return CommitMessage(
            sink_id=self.sink_id,
            epoch=self.epoch,
            write_id=str(self.write_id),
            partition_id=self.partition_id,
            attempt=self.attempt,
            points=points,
            rejected=rejected,
            checksum=checksum,
            run_id=self.run_id,
            query_id=self.query_id,
            store=store,
        )


class Stager:
    """Executor side of phase 1. One role: turn converted rows into a staged write.

    Lines are staged in chunks of at most ``config.chunk_points`` lines and
    about ``config.chunk_chars`` characters (a single longer line is a chunk
    of its own). With ``config.lanes`` > 1 (``promote_connections``) each chunk holds
    the lines of one lane only ([`twophase.protocol.stage.lanes`][twophase.protocol.stage.lanes]),
    in their given order.
    With ``config.compression`` gzip each chunk is compressed here, on the executor,
    into the gzip member promotion sends as it is ([`StagedChunk`][twophase.model.StagedChunk]).
    A call's spool keeps ``config.spool_memory`` bytes in memory, then spills to a
    temporary file in ``spool_dir`` (the system's temporary directory when None).
    """

    def __init__(self, db: Database, config: StagingConfig, spool_dir: str | None = None):
        self._db = db
        self._shape = _Shape(
            config.chunk_points, config.chunk_chars, config.lanes, config.compression == GZIP
        )
        self._spool_memory = config.spool_memory
        self._spool_dir = spool_dir

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
        in one transaction. ``items`` is read once, lazily, as the COPY goes
        (bounded memory: one block of lines at a time, and the spool).

        While the staging store is unreachable the transaction is repeated
        (``staging_retry_deadline``) under the same write id, from the spool
        (see the module); an attempt whose COMMIT landed is read back, not
        staged again. An error of the input itself is raised as it is.
        """
        check_sink_id(sink_id)
        write = _Write(sink_id, epoch, uuid.uuid4(), partition_id, attempt, run_id, query_id)
        with self._encoding(items, str(write.write_id)) as encoded:
            return self._db.retry(
                f"stage write {write.write_id}",
                lambda: self._stage(write, encoded),
                again=lambda: self._again(write, encoded),
                repeatable=lambda: encoded.intact,
            )

    @contextmanager
    def _encoding(self, items: Iterable[str | Rejected], write_id: str) -> Iterator[_Encoded]:
        if isinstance(items, list | tuple):  # in memory already: encoded again on a repeat
            yield _Reencoded(items, self._shape, write_id)
            return
        with Spool(self._spool_memory, self._spool_dir) as spool:
            yield _Spooled(items, self._shape, write_id, spool)

    def _again(self, write: _Write, encoded: _Encoded) -> CommitMessage:
        """A repeat: the earlier attempt's write if its COMMIT landed, else staged anew."""
        return self._landed(write) or self._stage(write, encoded)

    def _stage(self, write: _Write, encoded: _Encoded) -> CommitMessage:
        try:
            with self._db.transaction() as cur:
                chunks = _copy_chunks(cur, write, encoded.chunks())
                if encoded.rejected:
                    _copy_rejects(cur, write, encoded.rejects())
                message = write.message(
                    chunks.points,
                    encoded.rejected,
                    chunks.checksum.hexdigest(),
                    self._db.config.display_url,
                )
                _record_write(cur, message)
                crash_point("in_stage", write.sink_id)
        except psycopg.errors.UniqueViolation:
            # The write id is taken: write ids are fresh per call, so an earlier attempt
            # of this one committed after its read-back looked (its COMMIT was still on
            # its way) and the insert waited for it.
            landed = self._landed(write)
            if landed is None:
                raise
            return landed
        crash_point("after_stage", write.sink_id)
        return message

    def _landed(self, write: _Write) -> CommitMessage | None:
        """The message of ``write`` if an earlier attempt of this call committed it."""
        with self._db.transaction() as cur:
            cur.execute(
                "SELECT points, rejected, checksum FROM twophase_writes WHERE write_id = %s",
                (write.write_id,),
            )
            row = cur.fetchone()
        if row is None:
            return None
        log.info(
            "write %s of sink %s epoch %d: the attempt cut by the outage had committed "
            "(read back, not staged again)",
            write.write_id,
            write.sink_id,
            write.epoch,
            extra=fields(write.sink_id, write.epoch, write.run_id),
        )
        return write.message(int(row[0]), int(row[1]), str(row[2]), self._db.config.display_url)


class _Encoded(Protocol):
    """One staging call's input, encoded: readable once per attempt, the same each time.

    ``rejected`` (the count of rejected rows) and ``rejects()`` are complete once
    ``chunks()`` was read to its end. ``intact`` is false once the input itself
    failed: no attempt can then give the whole write.
    """

    rejected: int
    intact: bool

    def chunks(self) -> Iterator[StagedChunk]: ...

    def rejects(self) -> Iterator[Rejected]: ...


class _Reencoded:
    """An input in memory (a list or tuple): an attempt encodes it again, identically."""

    intact = True

    def __init__(
        self, items: list[str | Rejected] | tuple[str | Rejected, ...], shape: _Shape, write_id: str
    ) -> None:
        self._items = items
        self._shape = shape
        self._write_id = write_id
        self.rejected = 0

    def chunks(self) -> Iterator[StagedChunk]:
        self.rejected = 0
        return _encode(self._items, self._shape, self._write_id, self._count)

    def _count(self, rejects: list[Rejected]) -> None:
        self.rejected += len(rejects)

    def rejects(self) -> Iterator[Rejected]:
        for index, item in enumerate(self._items):
            checked = _checked(index, item)
            if not isinstance(checked, str):
                yield checked


class _Spooled:
    """An input read once: its chunks and rejected rows are spooled as they are encoded;
    an attempt reads the spool first, then encodes on from where the input was left."""

    def __init__(
        self, items: Iterable[str | Rejected], shape: _Shape, write_id: str, spool: Spool
    ) -> None:
        self._spool = spool
        # Resumed by each attempt where the last one stopped (pulled with next(): an
        # attempt that fails leaves it open).
        self._live = _encode(items, shape, write_id, self._keep)
        self.rejected = 0
        self.intact = True

    def chunks(self) -> Iterator[StagedChunk]:
        yield from self._spool.read(_CHUNKS)
        while True:
            try:
                chunk = next(self._live)
            except StopIteration:
                return
            except BaseException:
                self.intact = False  # the input failed: what it had left is lost
                raise
            self._spool.add(_CHUNKS, chunk, _chunk_bytes(chunk))  # before the COPY sees it
            yield chunk

    def _keep(self, rejects: list[Rejected]) -> None:
        self.rejected += len(rejects)
        size = sum(len(r.reason) + len(r.payload) + _REJECT_BYTES for r in rejects)
        self._spool.add(_REJECTS, rejects, size)

    def rejects(self) -> Iterator[Rejected]:
        for block in self._spool.read(_REJECTS):
            yield from block


def _chunk_bytes(chunk: StagedChunk) -> int:
    held = len(chunk.gz) if chunk.gz is not None else len(chunk.body or "")
    return held + _END_BYTES * len(chunk.ends or ())


def _encode(
    items: Iterable[str | Rejected],
    shape: _Shape,
    write_id: str,
    rejects: Callable[[list[Rejected]], None],
) -> Iterator[StagedChunk]:
    """The chunks of ``items``' lines in staged order; each block's rejected rows are
    handed to ``rejects`` before the block's chunks are given."""
    chooser = LaneChooser(shape.lanes)
    seq = first = 0  # the next line's seq; the block's first item's index in the input
    for block in _blocks(items, shape.chunk_points):
        lines = [item for item in block if isinstance(item, str)]
        if max(map(len, lines), default=0) > _LONG_CHARS:  # rare: a line may be too long
            block = [_checked(first + i, item) for i, item in enumerate(block)]
            lines = [item for item in block if isinstance(item, str)]
        first += len(block)
        if len(lines) != len(block):
            rejects([item for item in block if not isinstance(item, str)])
        for lane, lane_lines in enumerate(chooser.split(lines)):
            for part in _split_by_chars(lane_lines, shape.chunk_chars):
                yield StagedChunk.of_lines(write_id, seq, part, lane, compressed=shape.compressed)
                seq += len(part)


def _checked(index: int, item: str | Rejected) -> str | Rejected:
    """``item``, or the rejection of a line longer than MAX_LINE_BYTES: no staged chunk
    holds more, so that reading one back is bounded (``StagedChunk.text``); nothing
    twophase stages is dropped, so it is a dead letter."""
    if not isinstance(item, str) or len(item) <= _LONG_CHARS:
        return item
    data = item.encode("utf-8", "surrogatepass")
    if len(data) <= MAX_LINE_BYTES:
        return item
    reason = f"the line is {len(data)} bytes, over the {MAX_LINE_BYTES} a staged line may hold"
    return Rejected(index, reason, cut_payload(data))


def _record_write(cur: psycopg.Cursor[Any], message: CommitMessage) -> None:
    cur.execute(
        "INSERT INTO twophase_writes (write_id, sink_id, epoch, run_id, partition_id,"
        " attempt, points, rejected, checksum) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (
            uuid.UUID(message.write_id),
            message.sink_id,
            message.epoch,
            message.run_id,
            message.partition_id,
            message.attempt,
            message.points,
            message.rejected,
            message.checksum,
        ),
    )


# Binary COPY: text COPY escapes every line on the client and PostgreSQL parses it back;
# binary hands both the bytes as they are (the study "Binary COPY" in
# `git show f5c61bb^:bench/README.md`).
_COPY_CHUNKS = (
    "COPY twophase_staged_chunks (write_id, chunk, first_seq, points, ends, body, lane,"
    " body_gz, checksum) FROM STDIN (FORMAT BINARY)"
)
_CHUNK_TYPES = ("uuid", "int4", "int4", "int4", "int4[]", "text", "int2", "bytea", "bytea")


def _copy_chunks(
    cur: psycopg.Cursor[Any], write: _Write, chunks: Iterable[StagedChunk]
) -> _ChunkCopy:
    with cur.copy(_COPY_CHUNKS) as copy:
        counted = _ChunkCopy(copy, write.write_id, write.sink_id)
        for chunk in chunks:
            counted.write(chunk)
    return counted


class _ChunkCopy:
    """Writes one write's chunks into a running COPY, counting and hashing its lines:
    the write's checksum, and each chunk's own digest, which promotion checks before
    the chunk is sent (I1)."""

    def __init__(self, copy: psycopg.Copy, write_id: uuid.UUID, sink_id: str) -> None:
        copy.set_types(list(_CHUNK_TYPES))
        self._copy = copy
        self._write_id = write_id
        self._sink_id = sink_id
        self.chunks = 0
        self.points = 0
        self.checksum = LineChecksum()

    def write(self, chunk: StagedChunk) -> None:
        stored = chunk.stored  # a text body encoded once, for both digests
        digest = chunk_digest(self._write_id, chunk.first_seq, chunk.points, stored)
        self._copy.write_row(
            (
                self._write_id,
                self.chunks,
                chunk.first_seq,
                chunk.points,
                chunk.ends,
                chunk.body,
                chunk.lane,
                chunk.gz,
                digest,
            )
        )
        self.checksum.add_joined(stored)
        before, self.points, self.chunks = self.points, self.points + chunk.points, self.chunks + 1
        # Once per chunk, and once per _CRASH_EVERY lines: a write of a few points (a
        # task's share of an aggregate) gets there too. The COPY is under way, nothing
        # committed.
        for _ in range(1 + self.points // _CRASH_EVERY - before // _CRASH_EVERY):
            crash_point("stage_rows", self._sink_id)


def _blocks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    iterator = iter(items)
    while block := list(itertools.islice(iterator, size)):
        yield block


def _split_by_chars(lines: list[str], max_chars: int) -> Iterator[list[str]]:
    """``lines`` cut so that each part's lines and newlines hold at most ``max_chars``."""
    if not lines:
        return
    if sum(map(len, lines)) + len(lines) <= max_chars:  # the usual case, at C speed
        yield lines
        return
    yield from batches(lines, len(lines), max_chars, lambda line: len(line) + 1)


def _copy_rejects(cur: psycopg.Cursor[Any], write: _Write, rejects: Iterable[Rejected]) -> None:
    sql = (
        "COPY twophase_dead_letters (sink_id, epoch, write_id, seq, phase, reason, payload)"
        " FROM STDIN"
    )
    with cur.copy(sql) as copy:
        for rej in rejects:
            copy.write_row(
                (
                    write.sink_id,
                    write.epoch,
                    write.write_id,
                    rej.index,
                    Phase.STAGE,
                    rej.reason,
                    rej.payload,
                )
            )
