"""The two sides of every comparison: one epoch through twophase, or straight to InfluxDB.

* :class:`TwoPhaseSide`: stage (COPY through :class:`twophase.protocol.stage.stager.Stager`),
  then ``Committer.commit`` (recover, decide, promote, mark), exactly what a
  sink does per epoch. One write per epoch.
* :class:`DirectSide`: what a user writes instead: the same lines POSTed
  straight to InfluxDB by :class:`bench.direct.DirectWriter` (none of
  twophase's code), no staging; over several connections at once, as
  partitions write, by :class:`bench.direct.PartitionedWriter`; with
  ``gzip_level``, each request gzip-compressed as a user does it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.direct import DirectWriter, PartitionedWriter
from twophase.config import TargetConfig
from twophase.model import EpochState
from twophase.protocol.commit.committer import Committer
from twophase.protocol.commit.runtime import TwoPhase
from twophase.protocol.stage.stager import Stager

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

    def __init__(
        self,
        tp: TwoPhase,
        sink_id: str,
        first_epoch: int = 0,
        committer: Committer | None = None,
        stager: Stager | None = None,
    ) -> None:
        self.tp = tp
        self.sink_id = sink_id
        self.epoch = first_epoch
        self.lease = tp.begin_run(sink_id, uuid.uuid4().hex, QUERY_ID)
        self.committer = committer or tp.committer
        self.stager = stager or tp.stager
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

    def rebegin(self) -> None:
        """Claim the sink again (after another process fenced this run, e.g. a recovery child)."""
        self.lease = self.tp.begin_run(self.sink_id, uuid.uuid4().hex, QUERY_ID)


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

    def run_all(self, epochs: Sequence[Sequence[str]]) -> float:
        """Several epochs' lines, one after the other: wall seconds in all."""
        return sum(self.run(lines) for lines in epochs)

    def close(self) -> None:
        self.writer.close()
