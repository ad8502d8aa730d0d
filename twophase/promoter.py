"""Phase 2, driver side: promote one decided epoch to InfluxDB and mark it COMMITTED.

``Promoter.promote`` streams one PRECOMMITTED epoch's fixed point set (I1)
to InfluxDB and marks it COMMITTED (I2). It may run any number of times for
the same epoch: InfluxDB overwrites identical points, so re-sending a fixed
point set in its fixed order changes nothing (I4). ``Promoter.send`` is the
send loop alone, which an operator's resend reuses.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import itertools
import logging
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass

from twophase.batching import batches
from twophase.config import InfluxConfig
from twophase.deadletters import DeadLetterLog
from twophase.errors import PermanentError, TwoPhaseError
from twophase.faults import crash_point
from twophase.ledger import Ledger
from twophase.model import DeadLetter, EpochPlan, Lease, LineChecksum, Phase, StagedChunk
from twophase.readahead import read_ahead
from twophase.reader import StagedReader
from twophase.sender import BatchSender

log = logging.getLogger("twophase.promoter")
_READ_AHEAD = 4  # pieces read from PostgreSQL while InfluxDB takes the current request


@dataclass(frozen=True)
class PromoteResult:
    sink_id: str
    epoch: int
    delivered: int
    rejected: int


class Promoter:
    """Sends one decided epoch to InfluxDB and marks it COMMITTED.

    Idempotent: the epoch's point set is fixed (I1) and sent in the same
    order each time; a crash anywhere leaves the epoch PRECOMMITTED and the
    next ``promote`` re-sends it whole. Rejected points become dead letters
    (once each, however often promotion runs). Raises InfluxUnavailableError
    when InfluxDB stays unreachable past the retry deadline; the epoch then
    stays PRECOMMITTED for a later recovery.
    """

    def __init__(
        self,
        ledger: Ledger,
        reader: StagedReader,
        sender: BatchSender,
        dead_letters: DeadLetterLog,
        config: InfluxConfig,
    ):
        self._ledger = ledger
        self._reader = reader
        self._sender = sender
        self._dead_letters = dead_letters
        self._batch_points = config.batch_points
        self._batch_bytes = config.batch_bytes

    def promote(self, lease: Lease, epoch: int, plan: EpochPlan | None = None) -> PromoteResult:
        """Send the epoch and mark it COMMITTED. ``plan`` is the attempt the decision
        already started (:meth:`Ledger.decide` with ``start_promotion``); without it
        an attempt is started here."""
        plan = plan or self._ledger.plan_promotion(lease, epoch)
        try:
            delivered, rejected = self.send(plan)
        except TwoPhaseError as exc:
            self._ledger.record_error(lease.sink_id, epoch, f"{type(exc).__name__}: {exc}")
            raise
        crash_point("after_promote", lease.sink_id)
        self._ledger.mark_committed(lease, epoch, delivered, rejected)
        crash_point("after_mark", lease.sink_id)
        log.info(
            "sink %s epoch %d committed: %d delivered, %d rejected",
            lease.sink_id,
            epoch,
            delivered,
            rejected,
        )
        return PromoteResult(lease.sink_id, epoch, delivered, rejected)

    def send(
        self, plan: EpochPlan, on_batch: Callable[[int], None] | None = None
    ) -> tuple[int, int]:
        """Send a plan's fixed point set once, in its fixed order; no state change.

        Staged chunks go out as they are stored, several to a request up to
        the batch limits; a chunk larger than the limits is cut into lines.
        Returns (delivered, rejected). Rejections become dead letters (once
        each). ``on_batch`` gets the running count of points sent, for
        progress. Raises PermanentError if the lines read back are not the
        decided ones (I1). Used by :meth:`promote` and by the resend of
        COMMITTED epochs.
        """
        tally = _Tally(plan)
        with contextlib.closing(self._read(plan)) as pieces:
            for request in _requests(pieces, self._batch_points, self._batch_bytes):
                rejects = self._sender.send(
                    b"\n".join(piece.data for piece in request),
                    sum(piece.points for piece in request),
                    functools.partial(_lines_of, request),
                )
                self._dead_letters.record(_dead_letters(plan, request, rejects))
                tally.add(request, len(rejects))
                if on_batch is not None:
                    on_batch(tally.delivered + tally.rejected)
                crash_point("promote_batch", plan.sink_id)
        tally.check_unchanged()
        return tally.delivered, tally.rejected

    def _read(self, plan: EpochPlan) -> Generator[_Piece, None, None]:
        """The plan's pieces: nothing to read for an epoch without points; an epoch within
        one request read at once (one round trip); a larger one through a server-side
        cursor, read ahead in a thread while InfluxDB takes the current request."""
        points = sum(w.points for w in plan.writes)
        if points == 0:
            return
        small = points <= self._batch_points
        pieces = self._pieces(plan, small)
        yield from (pieces if small else read_ahead(pieces, _READ_AHEAD))

    def _pieces(self, plan: EpochPlan, small: bool) -> Iterator[_Piece]:
        chunks = self._reader.chunks_of([w.write_id for w in plan.writes], small=small)
        for index, chunk in chunks:
            yield from _pieces_of(index, chunk, self._batch_points, self._batch_bytes)


@dataclass(frozen=True)
class _Piece:
    """Lines ``start:stop`` of a staged chunk of the plan's write number ``index``, as sent."""

    index: int
    chunk: StagedChunk
    start: int
    stop: int
    data: bytes  # the lines joined by newlines, UTF-8

    @property
    def points(self) -> int:
        return self.stop - self.start

    def lines(self) -> list[str]:
        return self.chunk.lines(self.start, self.stop)


def _pieces_of(index: int, chunk: StagedChunk, max_points: int, max_bytes: int) -> Iterator[_Piece]:
    """The chunk whole (the usual case), or cut into pieces within the batch limits."""
    data = chunk.body.encode("utf-8")
    if chunk.points <= max_points and len(data) <= max_bytes:
        yield _Piece(index, chunk, 0, chunk.points, data)
        return
    start = 0
    encoded = [line.encode("utf-8") for line in chunk.lines()]
    for group in batches(encoded, max_points, max_bytes, lambda line: len(line) + 1):
        stop = start + len(group)
        yield _Piece(index, chunk, start, stop, b"\n".join(group))
        start = stop


def _lines_of(request: Sequence[_Piece]) -> list[str]:
    return [line for piece in request for line in piece.lines()]


def _requests(pieces: Iterable[_Piece], max_points: int, max_bytes: int) -> Iterator[list[_Piece]]:
    """Consecutive pieces grouped into requests of at most ``max_points`` points and
    a body of at most ``max_bytes``."""
    # Each piece is sized with the newline joining it to the next; the body has
    # one newline fewer than pieces, hence the limit one byte over.
    return batches(pieces, max_points, max_bytes + 1, lambda p: len(p.data) + 1, lambda p: p.points)


def _dead_letters(
    plan: EpochPlan, request: Sequence[_Piece], rejects: Sequence[tuple[int, str]]
) -> list[DeadLetter]:
    """Each rejected line of a request, located in its chunk (seq = first_seq + offset)."""
    starts = list(itertools.accumulate((p.points for p in request), initial=0))
    letters = []
    for i, reason in rejects:
        number = bisect.bisect_right(starts, i) - 1
        piece = request[number]
        offset = piece.start + i - starts[number]
        letters.append(
            DeadLetter(
                plan.sink_id,
                plan.epoch,
                plan.writes[piece.index].write_id,
                piece.chunk.first_seq + offset,
                Phase.PROMOTE,
                f"InfluxDB rejected the point: {reason}",
                piece.chunk.line(offset),
            )
        )
    return letters


class _Tally:
    """What a send read back (counts and checksums per write) and its outcome."""

    def __init__(self, plan: EpochPlan) -> None:
        self._plan = plan
        self._sums = [LineChecksum() for _ in plan.writes]
        self._counts = [0] * len(plan.writes)
        self.delivered = self.rejected = 0

    def add(self, request: Sequence[_Piece], rejected: int) -> None:
        for piece in request:
            self._sums[piece.index].add_joined(piece.data)
            self._counts[piece.index] += piece.points
        self.delivered += sum(piece.points for piece in request) - rejected
        self.rejected += rejected

    def check_unchanged(self) -> None:
        """I1: what was read back is exactly what was staged and decided."""
        plan = self._plan
        for write, digest, count in zip(plan.writes, self._sums, self._counts, strict=True):
            if count != write.points or digest.hexdigest() != write.checksum:
                raise PermanentError(
                    f"sink {plan.sink_id!r} epoch {plan.epoch}: staged points of write "
                    f"{write.write_id} changed after the decision ({count} read, "
                    f"{write.points} staged); the epoch's state is left as it was for an "
                    "operator to inspect"
                )
