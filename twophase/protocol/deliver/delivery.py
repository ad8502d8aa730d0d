"""Delivering one decided epoch to one target: its fixed point set, in its fixed order.

[`TargetDelivery`][twophase.protocol.deliver.delivery.TargetDelivery] is the role a
promotion, a catch-up, a resend and a requeue share: read a decided epoch's
staged chunks back, check them against the decision (I1) and send them to
one target's server in requests within the batch limits, over the target's
lanes. It changes no epoch state: the promoter
([`twophase.protocol.commit.promoter`][twophase.protocol.commit.promoter]) records what a
target acknowledged and marks the epoch COMMITTED.

What a re-sent epoch does depends on the kind of target
([`twophase.targets.contract`][twophase.targets.contract]). A kind that overwrites (InfluxDB
overwrites a point with the same measurement, tag set and timestamp) takes the epoch
in requests over its lanes, and re-sending the fixed point set in its fixed order
changes nothing (I4). A transactional kind (PostgreSQL) takes the epoch over one lane
inside one transaction of its writer ([`EpochWriter`][twophase.targets.contract.EpochWriter]),
committed with a record that the epoch was delivered: readers never see part of an
epoch, and a repeat finds the record and sends nothing. The record names the
*generation* of the sink's epoch numbers on the target, read from the staging store
([`TargetLedger.generation`][twophase.protocol.ledger.target_ledger.TargetLedger.generation]) before
each epoch's transaction: only a record of the current generation skips the epoch, so
one written before a reset (the next query numbers its epochs from 0 again) or a
``targets resync --from-epoch`` sends nothing short. A transaction lost on the way (its
connection dropped) is started over whole, never continued.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass

from twophase.config import TargetConfig
from twophase.errors import PermanentError, TargetUnavailableError
from twophase.faults import crash_point
from twophase.logs import fields
from twophase.model import (
    DeadLetter,
    EpochPlan,
    LineChecksum,
    Phase,
    StagedChunk,
    chunk_digest,
)
from twophase.points.batching import batches
from twophase.protocol.deliver.broadcast import Bounds, Broadcast
from twophase.protocol.deliver.deadletters import DeadLetterLog
from twophase.protocol.deliver.readahead import read_ahead
from twophase.protocol.deliver.reader import StagedReader
from twophase.protocol.stage.lanes import fan_out
from twophase.retry import Progress, RetryPolicy, StagingRetry
from twophase.targets.contract import EpochWriter
from twophase.targets.sender import BatchSender

__all__ = ["Chunks", "Pulse", "SharedRead", "TargetDelivery", "before_each", "shared_read"]

log = logging.getLogger("twophase.protocol.delivery")
_READ_AHEAD = 4  # chunks read from PostgreSQL while the target takes the current request
# A read shared by several targets buffers 16 chunks, and about 8 MiB as stored, past
# the slowest target still taking; a target that took them all waits half a second for
# the next (about as long as a caught-up epoch takes) before the slowest reads on its own.
_SHARED = Bounds(depth=16, max_bytes=8 * 1024 * 1024, patience_s=0.5)

# An epoch's staged chunks as read: (the write's index in the plan, the chunk)
Chunks = Generator[tuple[int, StagedChunk], None, None]
SharedRead = Broadcast[tuple[int, StagedChunk]]


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
        config: TargetConfig,
        lanes: int = 1,
        retry: StagingRetry | None = None,
        epochs: EpochWriter | None = None,
        generation: Callable[[str, str], int] | None = None,
    ):
        self.name = name  # named in its dead letters
        self._reader = reader
        # (a commit's round: gives up after target_deadline, the whole target_retry_deadline)
        self._round_sender, self._sender = senders
        self._dead_letters = dead_letters
        self._batch_points = config.batch_points
        self._batch_bytes = config.batch_bytes
        # a transactional kind's writer: an epoch in one transaction, over one lane
        self._epochs = epochs
        # (sink, target) -> the generation its record of an epoch names, read from the
        # staging store for each epoch (a reset or a resync moves it on)
        if epochs is not None and generation is None:
            raise ValueError(f"target {name!r}: a transactional delivery needs the generation")
        self._generation = generation
        self._lanes = 1 if epochs is not None else lanes  # connections at once
        # re-sending is harmless (I4), so a read cut by a staging outage starts over
        self._retry = retry or StagingRetry(RetryPolicy(0, 0, 0))

    def deliver(
        self,
        plan: EpochPlan,
        check: Callable[[], None],
        *,
        round_only: bool = False,
        on_batch: Callable[[int], None] | None = None,
        shared: SharedRead | None = None,
    ) -> tuple[int, int]:
        """Send the plan ([`send`][twophase.protocol.deliver.delivery.TargetDelivery.send]), the
        whole send repeated through a staging outage; ``check`` runs before every request and
        retry, and stops the delivery by raising. Returns (delivered, rejected).
        ``shared``: the plan's chunks read and checked once for several targets
        ([`shared_read`][twophase.protocol.deliver.delivery.shared_read]), taken by the first try
        if this target has not taken it yet; a repeat reads on its own. This target is dropped
        from it once the delivery ends, however it ended, so that the others never wait for it.

        TargetUnavailableError once the server gave no answer for
        ``target_retry_deadline`` (``round_only``: for ``target_deadline``, a
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
        first: list[Chunks | None] = []
        try:
            if shared is not None:
                first.append(shared.take(self.name))
            return self._retry(
                "promote",
                lambda: self._send(plan, sender, sent, check, first.pop() if first else None),
                progress=progress,
            )
        finally:
            if shared is not None:
                shared.drop(self.name)

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
        Used by the resend of COMMITTED epochs: a transactional target takes the epoch
        again even though its record says it holds it.
        """
        return self._send(plan, self._sender, on_batch, before_request, again=True)

    def _send(
        self,
        plan: EpochPlan,
        sender: BatchSender,
        on_batch: Callable[[int], None] | None,
        before_request: Callable[[], None] | None,
        shared: Chunks | None = None,
        *,
        again: bool = False,
    ) -> tuple[int, int]:
        # An epoch without points (Spark's batches without data) costs a transactional
        # target nothing: there is nothing to make visible, nor to send again.
        if self._epochs is None or not _points(plan):
            return self._send_chunks(plan, sender, on_batch, before_request, shared)
        first = [shared] if shared is not None else []
        return sender.repeat(
            lambda: self._transaction(
                plan, sender, on_batch, before_request, first.pop() if first else None, again
            ),
            _points(plan),
            before_request,
        )

    def _transaction(
        self,
        plan: EpochPlan,
        sender: BatchSender,
        on_batch: Callable[[int], None] | None,
        check: Callable[[], None] | None,
        shared: Chunks | None,
        again: bool,
    ) -> tuple[int, int]:
        """The epoch sent once inside one transaction of the target, committed with its
        delivered record; the counts of that record when the target holds the epoch
        already in the sink's current generation on it (a record of an older one, from
        before a reset or a resync from an epoch, is inert). Fenced before the
        transaction opens and before it commits (I5): a fenced run commits nothing on
        the target."""
        epochs = self._epochs
        assert epochs is not None and self._generation is not None
        if check is not None:
            check()
        generation = self._generation(plan.sink_id, self.name)
        try:
            held = epochs.begin(plan.sink_id, plan.epoch, self.name, again, generation=generation)
            if held is not None:
                log.info(
                    "sink %s epoch %d: target %s holds it already (its delivered record, "
                    "generation %d)",
                    plan.sink_id,
                    plan.epoch,
                    self.name,
                    generation,
                    extra=fields(plan.sink_id, plan.epoch),
                )
                return held
            counts = self._send_chunks(plan, sender, on_batch, check, shared)
            if check is not None:
                check()
            crash_point("before_target_commit", plan.sink_id)
            epochs.commit(*counts)
        except BaseException:
            epochs.rollback()
            raise
        crash_point("after_target_commit", plan.sink_id)
        return counts

    def _send_chunks(
        self,
        plan: EpochPlan,
        sender: BatchSender,
        on_batch: Callable[[int], None] | None,
        before_request: Callable[[], None] | None,
        shared: Chunks | None = None,
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
        chunks = self._read(plan, small) if shared is None else shared
        changed: list[PermanentError] = []
        with contextlib.closing(chunks):
            pieces = self._pieces(_sent_first(chunks, changed))
            if small or self._lanes == 1:
                lane(pieces)
            else:
                fan_out(
                    pieces,
                    lambda piece: piece.chunk.lane % self._lanes,
                    self._lanes,
                    lambda _, pieces: lane(pieces),
                )
        if changed:
            raise changed[0]
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

    def _read(self, plan: EpochPlan, small: bool) -> Chunks:
        """The plan's chunks, checked: an epoch within one request (``small``) read at
        once (one round trip); a larger one through a server-side cursor, read ahead in
        a thread while the target takes the requests."""
        chunks = self._checked(plan, small)
        yield from (chunks if small else read_ahead(chunks, _READ_AHEAD))

    def _checked(self, plan: EpochPlan, small: bool) -> Chunks:
        """The plan's chunks, read from the staging store and checked against the
        decision (I1) as they pass: PermanentError at a chunk that no longer matches its
        checksum, before it is given; at the end, when a write's count (or, for chunks
        staged without checksums, its checksum) is not the decided one. Nothing to read
        for an epoch without points."""
        if not any(w.points for w in plan.writes):
            return
        check = _Check(plan)
        read = self._reader.chunks_of([w.write_id for w in plan.writes], small=small)
        with contextlib.closing(read):  # a chunk found changed: its cursor closed at once
            yield from check.reading(read)
        check.unchanged()

    def _pieces(self, chunks: Iterable[tuple[int, StagedChunk]]) -> Iterator[_Piece]:
        for index, chunk in chunks:
            yield from _pieces_of(index, chunk, self._batch_points, self._batch_bytes)


def shared_read(plan: EpochPlan, targets: Sequence[TargetDelivery]) -> SharedRead:
    """The plan's chunks read and checked once (by the first target's reader: every
    target of a sink reads the same staging store), for every one of ``targets`` to
    take ([`Broadcast.take`][twophase.protocol.deliver.broadcast.Broadcast.take]) by its name.
    A target left behind reads again on its own, checked as well, and read ahead."""
    reader = targets[0]
    small = _points(plan) <= reader._batch_points
    return Broadcast(
        reader._checked(plan, small),
        [t.name for t in targets],
        _SHARED,
        size=lambda chunk: len(chunk[1].stored),
        again=lambda: reader._read(plan, small),
    )


class Pulse:
    """What the deliveries of one epoch to several targets, each on a thread of its own,
    share: when a target's server last took a request (any target's), and whether they
    were stopped (one failed with what is no target's fault: the others start no request
    more). Its methods are what the deliveries call, from their threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self.stopped = False

    def beat(self, _points: int = 0) -> None:
        """A server took a request (``on_batch``), or a target took the epoch."""
        with self._lock:
            self._last = time.monotonic()

    def silent_s(self) -> float:
        """Seconds since a server last took a request."""
        with self._lock:
            return time.monotonic() - self._last

    def stop(self) -> None:
        self.stopped = True

    def check(self) -> None:
        """Before each request: TargetUnavailableError once stopped."""
        if self.stopped:
            raise TargetUnavailableError("stopped: another target's delivery failed")


def before_each(*checks: Callable[[], None] | None) -> Callable[[], None]:
    """One check to run before each request: ``checks`` in their order (None: none)."""
    steps = [c for c in checks if c is not None]

    def check() -> None:
        for step in steps:
            step()

    return check


class _ChangedError(PermanentError):
    """I1 broken, found at the end of a read: raised once what was read is sent."""


def _sent_first(
    chunks: Iterable[tuple[int, StagedChunk]], changed: list[PermanentError]
) -> Iterator[tuple[int, StagedChunk]]:
    """``chunks``; an epoch found changed at the end of the read put in ``changed``,
    raised once the lanes sent what was read: a damaged member a request carries is
    found by the sender (refused, then taken apart), which names it. (Only chunks
    staged without checksums get that far: a chunk with one that changed raises as it
    is read, before it is given.)"""
    try:
        yield from chunks
    except _ChangedError as exc:
        changed.append(PermanentError(str(exc)))


def _points(plan: EpochPlan) -> int:
    return sum(w.points for w in plan.writes)


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
                f"the target rejected the point: {reason}",
                piece.chunk.line(offset),
                target=target,
            )
        )
    return letters


class _Tally:
    """A send's outcome; lanes report what they sent from their threads."""

    def __init__(self, plan: EpochPlan) -> None:
        self._lock = threading.Lock()
        self.points = _points(plan)
        self.delivered = self.rejected = 0

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


class _Check:
    """What a read gave back against the decision (I1), chunk by chunk before a chunk
    is handed on, and write by write at the end.

    A chunk staged with a digest (``StagedChunk.checksum``) is checked as it is read:
    its bytes, write, place (the next seq of its write) and count, so a chunk changed
    after the decision raises here and nothing of it, nor of any chunk after it,
    reaches a target. Its bytes are hashed once, for that digest alone: a write all of
    whose chunks matched theirs and whose count is the decided one is what was staged.
    A chunk staged before chunks had digests adds to its write's checksum, compared
    at the end of the read, after what was read was sent."""

    def __init__(self, plan: EpochPlan) -> None:
        self._plan = plan
        self._sums = [LineChecksum() for _ in plan.writes]
        self._counts = [0] * len(plan.writes)
        self._hashed = [False] * len(plan.writes)  # a chunk without a digest was read
        self._digested = [False] * len(plan.writes)  # a chunk with one was read

    def reading(
        self, chunks: Iterable[tuple[int, StagedChunk]]
    ) -> Iterator[tuple[int, StagedChunk]]:
        """``chunks``, each checked, or counted and hashed as stored, as it is read."""
        for index, chunk in chunks:
            if chunk.checksum is None:
                self._sums[index].add_joined(chunk.stored)
                self._hashed[index] = True
            else:
                self._verify(index, chunk)
                self._digested[index] = True
            self._counts[index] += chunk.points
            yield index, chunk

    def _verify(self, index: int, chunk: StagedChunk) -> None:
        """PermanentError unless the chunk is where its write's next seq is and its
        bytes and count are those staged there."""
        digest = chunk_digest(chunk.write_id, chunk.first_seq, chunk.points, chunk.stored)
        if chunk.first_seq == self._counts[index] and digest == chunk.checksum:
            return
        plan = self._plan
        raise PermanentError(
            f"sink {plan.sink_id!r} epoch {plan.epoch}: staged points of write "
            f"{chunk.write_id} changed after the decision (its chunk at seq "
            f"{chunk.first_seq} no longer matches its checksum, or is out of place); "
            "nothing of it was sent; the epoch's state is left as it was for an operator "
            "to inspect"
        )

    def unchanged(self) -> None:
        """I1: what was read back is exactly what was staged and decided."""
        plan = self._plan
        for index, write in enumerate(plan.writes):
            count = self._counts[index]
            whole = self._digested[index] and not self._hashed[index]
            digest = self._sums[index].hexdigest()
            if count != write.points or not (whole or digest == write.checksum):
                raise _ChangedError(
                    f"sink {plan.sink_id!r} epoch {plan.epoch}: staged points of write "
                    f"{write.write_id} changed after the decision ({count} read, "
                    f"{write.points} staged); the epoch's state is left as it was for an "
                    "operator to inspect"
                )
