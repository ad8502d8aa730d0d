"""The two roles of a driver of one's own: a stager where the rows are, a committer on
the driver.

They are the protocol's public face, as a sink has two sides in Flink's two-phase
sinks (a writer on the task managers, a committer on the job manager):

- [`ExecutorStager`][twophase.roles.ExecutorStager] runs where the rows are (a Spark
  task, a worker process): phase 1 stages an epoch's points in the staging store and
  returns a [`CommitMessage`][twophase.model.CommitMessage] for the driver. It is
  picklable: it holds the staging store's settings only, and each process opens one
  pool on first use.
- [`DriverCommitter`][twophase.roles.DriverCommitter] runs on the driver: it claims the
  sink for a run, commits each epoch from its tasks' messages (phase 2: recover,
  decide, promote, mark), recovers what older runs left, and records the run's end.

Everything else a commit takes (the ledger, the targets' deliveries, GC) is wired
inside the committer and is not part of the API.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from twophase.config import StagingConfig, TwoPhaseConfig
from twophase.model import CommitMessage, Lease
from twophase.points.builder import Rejected
from twophase.protocol.commit.committer import CommitOutcome
from twophase.protocol.commit.runtime import TwoPhase
from twophase.protocol.stage.stager import Stager
from twophase.store.database import shared_database


@dataclass(frozen=True)
class ExecutorStager:
    """Phase 1, where the rows are: stages one task's points of an epoch.

    Not idempotent by design: every call makes a new write, and only the write whose
    message reaches [`DriverCommitter.commit`][twophase.roles.DriverCommitter.commit]
    counts; a task's other attempts leave orphans that the commit's abort or GC
    removes. Nothing reaches a target here. Picklable, to be shipped to executors.
    """

    staging: StagingConfig

    def stage(
        self,
        sink_id: str,
        epoch: int,
        points: Iterable[str | Rejected],
        *,
        partition_id: int = 0,
        attempt: int = 0,
        run_id: str | None = None,
        query_id: str | None = None,
    ) -> CommitMessage:
        """Stage ``points`` (line-protocol lines, or rows a
        [`PointBuilder`][twophase.points.builder.PointBuilder] rejected, which become dead
        letters) as one new write of ``epoch``; the message names it for the commit."""
        stager = Stager(shared_database(self.staging), self.staging)
        return stager.stage(
            sink_id,
            epoch,
            points,
            partition_id=partition_id,
            attempt=attempt,
            run_id=run_id,
            query_id=query_id,
        )


class DriverCommitter:
    """Phase 2, on the driver: a run's claim, each epoch's commit, recovery, the run's end.

    Idempotent where a restart needs it: committing an epoch already decided is a
    replay, detected and skipped (``CommitOutcome.replay``); recovering promotes only
    what is still PRECOMMITTED; ending a run records its first end only. Open one per
    driver process (it holds the staging pool and the targets' writers) and close it,
    or use it as a context manager.
    """

    def __init__(self, parts: TwoPhase) -> None:
        self._parts = parts

    @classmethod
    def open(cls, config: TwoPhaseConfig) -> DriverCommitter:
        """Connect to the staging store (checking its schema revision: SchemaError when
        it is behind) and make each target's writer through its kind."""
        return cls(TwoPhase.open(config))

    def stager(self) -> ExecutorStager:
        """The stager of this committer's staging store, to ship to the executors."""
        return ExecutorStager(self._parts.config.staging)

    def claim(self, sink_id: str, run_id: str, query_id: str | None) -> Lease:
        """Claim ``sink_id`` for a run that starts: fence every older run (I5), refuse a
        ``query_id`` other than the sink's (a reset checkpoint, I6), register the
        configured targets, and promote what older runs left PRECOMMITTED."""
        return self._parts.claim(sink_id, run_id, query_id)

    def commit(self, lease: Lease, epoch: int, messages: Iterable[CommitMessage]) -> CommitOutcome:
        """Decide ``epoch`` from the messages of all its tasks and promote it to the
        targets: older PRECOMMITTED epochs first (I3), COMMITTED once ``min_targets``
        hold it. A decided epoch is a replay: its new writes are discarded."""
        return self._parts.committer.commit(lease, epoch, list(messages))

    def recover(self, lease: Lease) -> tuple[int, ...]:
        """Promote every PRECOMMITTED epoch of the sink in increasing order, stopping at
        the first failure; the epochs promoted."""
        return tuple(result.epoch for result in self._parts.committer.recover(lease))

    def end(self, lease: Lease, *, failed: bool = False) -> bool:
        """Record that the run ended (``stopped``, or ``failed``): True when this call
        recorded it, False when an end was recorded before. Fences nothing."""
        reason = "failed" if failed else "stopped"
        return self._parts.runs.end(lease.sink_id, lease.run_id, reason)

    def close(self) -> None:
        """Wait for background promotions (raising the first failure), then disconnect."""
        self._parts.close()

    def __enter__(self) -> DriverCommitter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
