"""The two sides of the in-process comparisons, and the points they both send.

* points: deterministic line protocol (measurement ``stream_stats``, tags ``isp`` and
  ``stream_id``, four integer fields), byte-identical to what twophase's point builder
  makes from such rows; each seed owns its own 1000-second time range, so two epochs
  never write the same point unless they use the same seed.
* :class:`TwoPhaseSide`: one epoch through twophase: stage (COPY through the stager),
  then ``Committer.commit`` (recover, decide, promote, mark), as a sink does per epoch.
* :class:`DirectSide`: what a user writes instead, written without twophase's code:
  the same lines POSTed straight to InfluxDB's ``/write`` in requests of 5,000 lines
  (urllib3, an exception on anything but 2xx, no retries: at-least-once), over one
  connection or several at once (as partitions write), each body gzip-compressed as a
  user compresses it when ``gzip_level`` is set.
"""

from __future__ import annotations

import gzip
import itertools
import math
import time
import uuid
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlencode

import urllib3

from twophase.config import TargetConfig
from twophase.model import EpochState
from twophase.protocol.commit.runtime import TwoPhase

BASE_NS = 1_700_000_000_000_000_000  # 2023-11-14T22:13:20Z
SEED_SPAN_NS = 1_000 * 1_000_000_000
STEP_NS = 1_000  # between consecutive points of an epoch (1M points span one second)
ISPS = ("acme", "globex", "initech")
STREAMS = 100
MEASUREMENT = "stream_stats"


def line(i: int, start_ns: int) -> str:
    """Point ``i`` of an epoch whose first point is at ``start_ns``."""
    return (
        f"{MEASUREMENT},isp={ISPS[i % 3]},stream_id=s{(i // 3) % STREAMS} "
        f"bytes_cdn={i * 7 % 100_000}i,bytes_p2p={i * 13 % 100_000}i,"
        f"events={i % 500}i,users={i % 97}i {start_ns + i * STEP_NS}"
    )


def start_of(seed: int) -> int:
    return BASE_NS + seed * SEED_SPAN_NS


def epoch_lines(count: int, seed: int) -> list[str]:
    """The same lines, prebuilt (so building them is outside every timing)."""
    start = start_of(seed)
    return [line(i, start) for i in range(count)]


BATCH_LINES = 5000


class DirectWriteError(RuntimeError):
    """InfluxDB answered a write with an error."""


class DirectWriter:
    """POST /write?db=...&precision=ns, ``batch`` lines a request, one connection; each
    body gzip-compressed at ``gzip_level`` (None: sent as text)."""

    def __init__(
        self,
        url: str,
        database: str,
        batch: int = BATCH_LINES,
        timeout_s: float = 30.0,
        gzip_level: int | None = None,
    ) -> None:
        query = urlencode({"db": database, "precision": "ns"})
        self.url = f"{url.rstrip('/')}/write?{query}"
        self.batch = batch
        self.gzip_level = gzip_level
        self.headers = {} if gzip_level is None else {"Content-Encoding": "gzip"}
        self.pool = urllib3.PoolManager(
            maxsize=1, timeout=urllib3.Timeout(connect=timeout_s, read=timeout_s), retries=False
        )

    def write(self, lines: Iterable[str]) -> int:
        """Send every line; return how many. Raises DirectWriteError on a refusal."""
        sent = 0
        iterator = iter(lines)
        while batch := list(itertools.islice(iterator, self.batch)):
            body = "\n".join(batch).encode()
            if self.gzip_level is not None:
                body = gzip.compress(body, compresslevel=self.gzip_level)
            response = self.pool.request("POST", self.url, body=body, headers=self.headers)
            if response.status >= 300:
                raise DirectWriteError(f"InfluxDB answered {response.status}: {response.data!r}")
            sent += len(batch)
        return sent

    def close(self) -> None:
        self.pool.clear()


class PartitionedWriter:
    """What a ``foreachPartition`` writer does with ``connections`` partitions: the lines
    cut into that many consecutive parts, each POSTed by its own thread over its own
    connection, at once; each body gzip-compressed at ``gzip_level`` (None: as text)."""

    def __init__(
        self, url: str, database: str, connections: int, gzip_level: int | None = None
    ) -> None:
        self.writers = [
            DirectWriter(url, database, gzip_level=gzip_level) for _ in range(connections)
        ]
        self.pool = ThreadPoolExecutor(connections)

    def write(self, lines: Sequence[str]) -> int:
        size = math.ceil(len(lines) / len(self.writers))
        parts = [lines[i * size : (i + 1) * size] for i in range(len(self.writers))]
        return sum(
            self.pool.map(lambda job: job[0].write(job[1]), zip(self.writers, parts, strict=True))
        )

    def close(self) -> None:
        self.pool.shutdown()
        for writer in self.writers:
            writer.close()


QUERY_ID = "twophase-bench"


class BenchError(RuntimeError):
    """A measured run did not do what it should (points missing, wrong state)."""


@dataclass
class Phases:
    """Where a twophase epoch's time went, per epoch (seconds)."""

    stage: list[float] = field(default_factory=list)
    commit: list[float] = field(default_factory=list)


class TwoPhaseSide:
    """Runs epochs of one sink through the full protocol; ``run`` returns wall seconds."""

    name = "twophase"

    def __init__(self, tp: TwoPhase, sink_id: str) -> None:
        self.tp = tp
        self.sink_id = sink_id
        self.epoch = 0
        self.lease = tp.begin_run(sink_id, uuid.uuid4().hex, QUERY_ID)
        self.committer = tp.committer
        self.stager = tp.stager
        self.phases = Phases()

    def run(self, lines: Sequence[str]) -> float:
        epoch, self.epoch = self.epoch, self.epoch + 1
        started = time.perf_counter()
        message = self.stager.stage(self.sink_id, epoch, lines)
        staged = time.perf_counter()
        outcome = self.committer.commit(self.lease, epoch, [message])
        done = time.perf_counter()
        delivered = outcome.promoted.delivered if outcome.promoted else 0
        if outcome.state != EpochState.COMMITTED or delivered != len(lines):
            raise BenchError(f"epoch {epoch}: {outcome.state}, {delivered}/{len(lines)} delivered")
        self.phases.stage.append(staged - started)
        self.phases.commit.append(done - staged)
        return done - started


class DirectSide:
    """Sends an epoch's lines straight to InfluxDB in batches; ``run`` returns wall seconds."""

    name = "direct"

    def __init__(
        self, config: TargetConfig, connections: int = 1, gzip_level: int | None = None
    ) -> None:
        database = config.influxdb.database or ""
        self.writer: DirectWriter | PartitionedWriter = (
            DirectWriter(config.url, database, gzip_level=gzip_level)
            if connections == 1
            else PartitionedWriter(config.url, database, connections, gzip_level)
        )

    def run(self, lines: Sequence[str]) -> float:
        started = time.perf_counter()
        sent = self.writer.write(lines)
        elapsed = time.perf_counter() - started
        if sent != len(lines):
            raise BenchError(f"direct write: {sent} of {len(lines)} lines sent")
        return elapsed

    def close(self) -> None:
        self.writer.close()
