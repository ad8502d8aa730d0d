"""Delivering one decided epoch to one target: its fixed point set, in its fixed order.

[`TargetDelivery`][twophase.protocol.delivery.TargetDelivery] is the role a
promotion, a catch-up, a resend and a requeue share: read a decided epoch's
staged chunks back, check them against the decision (I1) and send them to
one target's server in requests within the batch limits, over the target's
lanes. It changes no epoch state: the promoter
([`twophase.protocol.promoter`][twophase.protocol.promoter]) records what a
target acknowledged and marks the epoch COMMITTED.

What a re-sent body does depends on the kind of target (stated by its
writer, [`twophase.influx.writers`][twophase.influx.writers]): InfluxDB
overwrites a point with the same measurement, tag set and timestamp, so
re-sending a fixed point set in its fixed order changes nothing (I4).
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import itertools
import logging
import threading
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass

from twophase.config import InfluxConfig
from twophase.errors import PermanentError
from twophase.faults import crash_point
from twophase.influx.sender import BatchSender
from twophase.model import DeadLetter, EpochPlan, LineChecksum, Phase, StagedChunk
from twophase.points.batching import batches
from twophase.protocol.deadletters import DeadLetterLog
from twophase.protocol.lanes import fan_out
from twophase.protocol.readahead import read_ahead
from twophase.protocol.reader import StagedReader
from twophase.retry import Progress, RetryPolicy, StagingRetry

__all__ = ["TargetDelivery"]

log = logging.getLogger("twophase.protocol.delivery")
_READ_AHEAD = 4  # pieces read from PostgreSQL while InfluxDB takes the current request


class TargetDelivery:
    """Delivers decided epochs to one named target. No state change.

    Idempotent in effect: the epoch's point set is fixed (I1) and sent in
    the same order each time, so a delivery repeated after a crash or a
    failure re-sends it whole, and the target ends as after one delivery
    (for a kind whose re-sent body overwrites; see the writers). Rejected
    points become the target's dead letters, once each however often the
    epoch is delivered. Thread-safe: a commit's thread and the catch-up
    worker may deliver different epochs at once (to different targets).
    """

    def __init__(
        self,
        name: str,
        reader: StagedReader,
        senders: tuple[BatchSender, BatchSender],
        dead_letters: DeadLetterLog,
        config: InfluxConfig,
        lanes: int = 1,
        retry: StagingRetry | None = None,
    ):
        self.name = name  # named in its dead letters
        self._reader = reader
        # (a commit's round: gives up after target_deadline, the whole influx_retry_deadline)
        self._round_sender, self._sender = senders
        self._dead_letters = dead_letters
        self._batch_points = config.batch_points
        self._batch_bytes = config.batch_bytes
        self._lanes = lanes  # connections at once: promote_connections
        # re-sending is harmless (I4), so a read cut by a staging outage starts over
        self._retry = retry or StagingRetry(RetryPolicy(0, 0, 0))

    def deliver(
        self,
        plan: EpochPlan,
        check: Callable[[], None],
        *,
        round_only: bool = False,
        on_batch: Callable[[int], None] | None = None,
    ) -> tuple[int, int]:
        """Send the plan ([`send`][twophase.protocol.delivery.TargetDelivery.send]), the whole
        send repeated through a staging outage; ``check`` runs before every request and
        retry, and stops the delivery by raising. Returns (delivered, rejected).

        InfluxUnavailableError once the server gave no answer for
        ``influx_retry_deadline`` (``round_only``: for ``target_deadline``, a
        commit's round, after which the commit decides whether to go on
        without this target)."""
        # Each request delivered is progress: a connection dropped after minutes of
        # sending begins a new staging outage, with the whole deadline to ride it out.
        progress = Progress()

        def sent(points: int) -> None:
            progress()
            if on_batch is not None:
                on_batch(points)

        sender = self._round_sender if round_only else self._sender
        return self._retry(
            "promote",
            lambda: self._send(plan, sender, sent, check),
            progress=progress,
        )

    def send(
        self,
        plan: EpochPlan,
        on_batch: Callable[[int], None] | None = None,
        before_request: Callable[[], None] | None = None,
    ) -> tuple[int, int]:
        """Send a plan's fixed point set once, in its fixed order; no state change.

        Staged chunks go out as they are stored, several to a request up to
        the batch limits: compressed chunks as their gzip members end to end
        (``Content-Encoding: gzip``, nothing decompressed), text chunks joined
        by newlines. A chunk larger than the limits is cut into lines, sent as
        text.
        With several lanes (``promote_connections``), an epoch larger than one
        request goes out over a connection per lane at once, each lane's
        chunks in the epoch's order (I4: a series keeps to its lane).
        Returns (delivered, rejected). Rejections become dead letters (once
        each). ``on_batch`` gets the running count of points sent, for
        progress; ``before_request`` runs before each request and each retry
        of one, in every lane, and stops the send by raising. Raises
        PermanentError if the lines read back are not the decided ones (I1).
        Used by `deliver` and by the resend of COMMITTED epochs.
        """
        return self._send(plan, self._sender, on_batch, before_request)

    def _send(
        self,
        plan: EpochPlan,
        sender: BatchSender,
        on_batch: Callable[[int], None] | None,
        before_request: Callable[[], None] | None,
    ) -> tuple[int, int]:
        tally = _Tally(plan)
        small = tally.points <= self._batch_points
        lane = functools.partial(
            self._send_lane,
            plan,
            sender=sender,
            tally=tally,
            on_batch=on_batch,
            check=before_request,
        )
        with contextlib.closing(self._read(plan, small)) as pieces:
            read = tally.reading(pieces)  # checksums in the order read, whatever the lanes
            if small or self._lanes == 1:
                lane(read)
            else:
                fan_out(
                    read,
                    lambda piece: piece.chunk.lane % self._lanes,
                    self._lanes,
                    lambda _, pieces: lane(pieces),
                )
        tally.check_unchanged()
        return tally.delivered, tally.rejected

    def _send_lane(
        self,
        plan: EpochPlan,
        pieces: Iterable[_Piece],
        *,
        sender: BatchSender,
        tally: _Tally,
        on_batch: Callable[[int], None] | None,
        check: Callable[[], None] | None,
    ) -> None:
        """Send pieces in requests over one connection, in their order."""
        for request in _requests(pieces, self._batch_points, self._batch_bytes):
            rejects = sender.send(
                _body(request),
                sum(piece.points for piece in request),
                functools.partial(_lines_of, request),
                before_attempt=check,  # the sender retries: checked before each try
                gzipped=request[0].gzipped,
            )
            if rejects:  # acknowledged, and its rejections not yet recorded
                crash_point("before_dead_letters", plan.sink_id)
            self._dead_letters.record(_dead_letters(plan, request, rejects, self.name))
            tally.sent(request, len(rejects), on_batch)
            crash_point("promote_batch", plan.sink_id)

    def _read(self, plan: EpochPlan, small: bool) -> Generator[_Piece, None, None]:
        """The plan's pieces: nothing to read for an epoch without points; an epoch within
        one request (``small``) read at once (one round trip); a larger one through a
        server-side cursor, read ahead in a thread while InfluxDB takes the requests."""
        if not any(w.points for w in plan.writes):
            return
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
    data: bytes  # the chunk as stored (whole), or the lines joined by newlines, UTF-8
    size: int  # bytes of the lines joined by newlines, uncompressed

    @property
    def points(self) -> int:
        return self.stop - self.start

    @property
    def gzipped(self) -> bool:
        """The piece is the chunk's gzip member, sent as it is."""
        return self.chunk.compressed and self.whole

    @property
    def whole(self) -> bool:
        return self.start == 0 and self.stop == self.chunk.points

    def lines(self) -> list[str]:
        return self.chunk.lines(self.start, self.stop)


def _pieces_of(index: int, chunk: StagedChunk, max_points: int, max_bytes: int) -> Iterator[_Piece]:
    """The chunk whole, as stored (the usual case), or cut into pieces of text within
    the batch limits (a compressed chunk is decompressed for it)."""
    data = chunk.stored
    size = chunk.size if chunk.compressed else len(data)  # a text body encoded once
    if chunk.points <= max_points and size <= max_bytes:
        yield _Piece(index, chunk, 0, chunk.points, data, size)
        return
    start = 0
    encoded = [line.encode("utf-8") for line in chunk.lines()]
    for group in batches(encoded, max_points, max_bytes, lambda line: len(line) + 1):
        stop = start + len(group)
        data = b"\n".join(group)
        yield _Piece(index, chunk, start, stop, data, len(data))
        start = stop


def _lines_of(request: Sequence[_Piece]) -> list[str]:
    return [line for piece in request for line in piece.lines()]


def _body(request: Sequence[_Piece]) -> bytes:
    """A request's body: gzip members end to end (each holds its lines' last newline:
    together, one gzip stream of the lines), or text pieces joined by newlines."""
    if request[0].gzipped:
        return b"".join(piece.data for piece in request)
    return b"\n".join(piece.data for piece in request)


def _requests(pieces: Iterable[_Piece], max_points: int, max_bytes: int) -> Iterator[list[_Piece]]:
    """Consecutive pieces grouped into requests of at most ``max_points`` points and
    ``max_bytes`` of lines (uncompressed), each all gzip members or all text."""
    # Each piece is sized with the newline joining it to the next; the body has
    # one newline fewer than pieces, hence the limit one byte over.
    for _, run in itertools.groupby(pieces, key=lambda p: p.gzipped):
        yield from batches(run, max_points, max_bytes + 1, lambda p: p.size + 1, lambda p: p.points)


def _dead_letters(
    plan: EpochPlan, request: Sequence[_Piece], rejects: Sequence[tuple[int, str]], target: str
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
                target=target,
            )
        )
    return letters


class _Tally:
    """What a send read back (counts and checksums per write) and its outcome; lanes
    report what they sent from their threads."""

    def __init__(self, plan: EpochPlan) -> None:
        self._plan = plan
        self._sums = [LineChecksum() for _ in plan.writes]
        self._counts = [0] * len(plan.writes)
        self._lock = threading.Lock()
        self.points = sum(w.points for w in plan.writes)
        self.delivered = self.rejected = 0

    def reading(self, pieces: Iterable[_Piece]) -> Iterator[_Piece]:
        """``pieces``, each counted as it is read; each chunk hashed as stored (I1)."""
        for piece in pieces:
            if piece.whole:  # the usual case: the piece is the chunk as stored
                self._sums[piece.index].add_joined(piece.data)
            elif piece.start == 0:  # a cut chunk's first piece: the chunk as stored
                self._sums[piece.index].add_joined(piece.chunk.stored)
            self._counts[piece.index] += piece.points
            yield piece

    def sent(
        self, request: Sequence[_Piece], rejected: int, progress: Callable[[int], None] | None
    ) -> None:
        """Count a request's outcome; tell ``progress`` the points sent so far (one
        lane at a time)."""
        with self._lock:
            self.delivered += sum(piece.points for piece in request) - rejected
            self.rejected += rejected
            if progress is not None:
                progress(self.delivered + self.rejected)

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
