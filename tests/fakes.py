"""Stand-ins for twophase's collaborators in unit tests: a clock, an InfluxDB writer, a
reader of staged chunks, a ledger, a collector, a PostgreSQL connection and a Spark task's
context, and the senders built on them."""

from __future__ import annotations

import dataclasses
import gzip
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from twophase.config import TargetConfig
from twophase.errors import BadPointsError, BatchTooLargeError, FencedError
from twophase.model import DeadLetter, EpochPlan, Lease, LineChecksum, StagedChunk, WriteRef
from twophase.points.batching import batches
from twophase.protocol.maintain.gc import GcReport
from twophase.protocol.stage.lanes import LaneChooser
from twophase.targets.sender import BatchSender


class FakeClock:
    """time.monotonic and time.sleep in one, moved by the test alone: sleeping advances
    the clock, instantly. ``now``: the time it starts at."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds


def text_of(body: bytes, gzipped: bool) -> str:
    """A request body's lines joined by newlines (gzip members hold each chunk's last
    newline: the stream's final one is dropped)."""
    if gzipped:
        return gzip.decompress(body).decode()[:-1]
    return body.decode()


class FakeInflux:
    """An InfluxDB 1.x stand-in: stores good lines, refuses bad ones like a partial write.

    ``fail`` decides per attempt whether the attempt fails before anything is
    stored (returning the exception to raise) -- the transient faults.
    """

    def __init__(
        self,
        clock: FakeClock,
        bad: Callable[[str], str | None] = lambda _: None,
        fail: Callable[[int, list[str]], Exception | None] = lambda _n, _l: None,
        max_lines: int | None = None,
        request_s: float = 0.01,
    ) -> None:
        self.clock, self.bad, self.fail = clock, bad, fail
        self.max_lines, self.request_s = max_lines, request_s
        self.stored: dict[str, int] = {}  # line -> times written
        self.bodies: list[list[str]] = []
        self.gzipped: list[bool] = []

    def write(self, body: bytes, gzipped: bool = False) -> None:
        lines = text_of(body, gzipped).split("\n")
        self.gzipped.append(gzipped)
        self.bodies.append(lines)
        self.clock.now += self.request_s
        error = self.fail(len(self.bodies), lines)
        if error is not None:
            raise error
        if self.max_lines is not None and len(lines) > self.max_lines:
            raise BatchTooLargeError("request too large (413)")
        reasons = [r for r in map(self.bad, lines) if r]
        for line in lines:
            if not self.bad(line):
                self.stored[line] = self.stored.get(line, 0) + 1
        if reasons:  # like 1.x: the first problem named, the good points kept
            raise BadPointsError(f"refused (400): {reasons[0]}", f"partial write: {reasons[0]}")

    def close(self) -> None:
        pass


class LineSender:
    """Lines sent the simple way over a BatchSender: in order, in batches of at most
    ``max_points`` lines and ``max_bytes`` bytes, each batch one body; rejections are
    indexes into ``lines``."""

    def __init__(self, sender: BatchSender, max_points: int = 5000, max_bytes: int = 4 << 20):
        self.sender, self.max_points, self.max_bytes = sender, max_points, max_bytes

    def send(self, lines: list[str]) -> list[tuple[int, str]]:
        encoded = [line.encode() for line in lines]
        rejected: list[tuple[int, str]] = []
        for batch in batches(
            range(len(lines)), self.max_points, self.max_bytes, lambda i: len(encoded[i]) + 1
        ):
            body = b"\n".join(encoded[i] for i in batch)
            part = [lines[i] for i in batch]
            sent = self.sender.send(body, len(batch), lambda part=part: part)  # type: ignore[misc]
            rejected += [(batch[0] + i, reason) for i, reason in sent]
        return rejected


def fake_config(deadline_s: float = 60.0) -> TargetConfig:
    return TargetConfig(
        url="http://fake", retry_initial_s=0.5, retry_max_s=4.0, retry_deadline_s=deadline_s
    )


def make_sender(
    writer: FakeInflux,
    clock: FakeClock,
    deadline_s: float = 60.0,
    max_points: int = 5000,
    max_bytes: int = 4 << 20,
    **kwargs: object,
) -> LineSender:
    config = fake_config(deadline_s)
    sender = BatchSender(writer, config, sleep=clock.sleep, clock=clock, **kwargs)  # type: ignore[arg-type]
    return LineSender(sender, max_points, max_bytes)


def lines_of(n: int) -> list[str]:
    return [f"m,host=h{i % 3} v={i}i {1_700_000_000_000_000_000 + i}" for i in range(n)]


class FakeReader:
    """The promoter's reader (chunks held in memory) and its dead-letter log in one."""

    def __init__(self, chunks: dict[str, list[StagedChunk]]) -> None:
        self._chunks = chunks
        self.letters: dict[tuple[str, int], DeadLetter] = {}

    def chunks_of(
        self, write_ids: Sequence[str], small: bool = False
    ) -> Iterator[tuple[int, StagedChunk]]:
        for index, write_id in enumerate(write_ids):
            for chunk in self._chunks[write_id]:
                yield index, chunk

    def record(self, letters: Sequence[DeadLetter]) -> None:
        for letter in letters:
            self.letters.setdefault((letter.write_id, letter.seq), letter)


def staged(
    writes: list[list[str]],
    chunk_points: int,
    lanes: int = 1,
    compressed: Callable[[], bool] = lambda: False,
) -> tuple[EpochPlan, FakeReader]:
    """A plan of ``writes`` (lists of lines) staged as the stager does: blocks of
    ``chunk_points`` lines, each cut into a chunk per lane, compressed when
    ``compressed()`` says so (asked per chunk: an epoch may mix both, as one staged
    before and after an upgrade does)."""
    refs: list[WriteRef] = []
    chunks: dict[str, list[StagedChunk]] = {}
    chooser = LaneChooser(lanes)
    for number, lines in enumerate(writes):
        write_id = f"w{number}"
        digest, seq, chunks[write_id] = LineChecksum(), 0, []
        for start in range(0, len(lines), chunk_points):
            for lane, part in enumerate(chooser.split(lines[start : start + chunk_points])):
                if part:
                    chunk = StagedChunk.of_lines(write_id, seq, part, compressed=compressed())
                    chunks[write_id].append(dataclasses.replace(chunk, lane=lane))
                    seq += len(part)
                    digest.add_joined(chunk.stored)
        refs.append(WriteRef(write_id, len(lines), digest.hexdigest()))
    plan = EpochPlan("s", 3, tuple(refs))
    return plan, FakeReader(chunks)


class FakeGc:
    """Records each collection; ``hold`` keeps one running until set; ``error`` fails it."""

    def __init__(self, error: Exception | None = None) -> None:
        self.calls: list[tuple[str | None, int | None]] = []
        self.hold = threading.Event()
        self.hold.set()
        self.error = error

    def collect(self, sink_id: str | None = None, *, limit: int | None = None) -> GcReport:
        self.calls.append((sink_id, limit))
        self.hold.wait(10)
        if self.error is not None:
            raise self.error
        return GcReport(sink_id, 1, 10, 0, False)


class FakeLedger:
    """The promoter's ledger: the lease holds for ``holds`` checks, then is fenced."""

    def __init__(self, plan: EpochPlan, holds: int) -> None:
        self.plan, self.holds = plan, holds
        self.checks = self.passed = 0
        self.marked: list[int] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()

    def plan_promotion(self, lease: Lease, epoch: int) -> EpochPlan:
        return self.plan

    def check_lease(self, lease: Lease) -> None:
        with self._lock:
            self.checks += 1
            if self.checks > self.holds:
                raise FencedError(f"run {lease.run_id} was fenced by a newer run")
            self.passed += 1

    def mark_committed(self, lease: Lease, epoch: int, delivered: int, rejected: int) -> None:
        self.marked.append(epoch)

    def record_error(self, sink_id: str, epoch: int | None, message: str) -> None:
        self.errors.append(message)


class FakeConnection:
    """Answers reads with ``row`` until told to fail."""

    def __init__(self, row: tuple[Any, ...] | None, fail: BaseException | None = None) -> None:
        self.row, self.fail = row, fail
        self.closed = False
        self.prepared: list[bool] = []

    def execute(self, query: str, params: Any, prepare: bool = False) -> FakeConnection:
        self.prepared.append(prepare)
        if self.fail is not None:
            raise self.fail
        return self

    def fetchone(self) -> tuple[Any, ...] | None:
        return self.row

    def close(self) -> None:
        self.closed = True


class FakeTaskContext:
    def __init__(self, **properties: str) -> None:
        self.properties = properties

    def getLocalProperty(self, key: str) -> str | None:
        return self.properties.get(key)

    def partitionId(self) -> int:
        return 3

    def attemptNumber(self) -> int:
        return 1
