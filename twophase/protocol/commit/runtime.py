"""Assembles the protocol's parts from one configuration.

``TwoPhase.open(config)`` checks the staging schema, makes each target's writer
(through its kind), and wires stager, ledger, promoter, committer, GC (by an operator,
and automatic after commits) and the runs' ends.
The Spark sink, the jobs and the CLI all start here, so they share one set
of defaults.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass

from twophase.config import BACKGROUND, TargetConfig, TwoPhaseConfig
from twophase.config.loading import server_of
from twophase.model import Lease
from twophase.protocol.commit.catchup import CatchUp
from twophase.protocol.commit.committer import Committer
from twophase.protocol.commit.handoff import Handoff
from twophase.protocol.commit.promoter import Promoter
from twophase.protocol.deliver.deadletters import DeadLetterLog
from twophase.protocol.deliver.delivery import TargetDelivery
from twophase.protocol.deliver.reader import StagedReader
from twophase.protocol.ledger.epoch_ledger import Ledger
from twophase.protocol.ledger.runs import Runs
from twophase.protocol.ledger.target_ledger import TargetLedger, TargetRoster
from twophase.protocol.maintain.autogc import AutoGc
from twophase.protocol.maintain.gc import GarbageCollector
from twophase.protocol.stage.stager import Stager
from twophase.store.database import Database
from twophase.targets import EpochWriter, TargetWriter, kind_of, make_writer, metering
from twophase.targets.sender import BatchSender, RetryEvent


@dataclass(frozen=True)
class TwoPhase:
    """The driver-side parts over one staging database and its targets.

    ``writer`` is the first target's; ``writers`` and ``deliveries`` hold every
    target's, by name, in configured order."""

    config: TwoPhaseConfig
    db: Database
    writer: TargetWriter
    stager: Stager
    ledger: Ledger
    reader: StagedReader
    promoter: Promoter
    committer: Committer
    gc: GarbageCollector
    runs: Runs
    auto_gc: AutoGc
    targets: TargetLedger
    writers: dict[str, TargetWriter]
    deliveries: dict[str, TargetDelivery]
    catch_up: CatchUp
    roster: TargetRoster

    @classmethod
    def open(
        cls,
        config: TwoPhaseConfig,
        db: Database | None = None,
        writer: TargetWriter | None = None,
        *,
        serve_metrics: bool = False,
    ) -> TwoPhase:
        """Connect, check the schema (SchemaError when behind) and wire the parts.

        ``db`` and ``writer`` default to ones made from ``config``; passing them shares a
        pool, or wraps the writer (fault injection in tests). With ``serve_metrics`` (the
        Spark driver) and ``metrics_port`` set, the writer is metered and this process
        serves its metrics there ([`twophase.targets.metering`][twophase.targets.metering]);
        the CLI never does, so an operator's shell holding the job's environment does not
        take the driver's port.
        """
        influx = config.target
        # every target promotes at once: a reader and its lanes' checks each
        db = db or Database(config.staging, max_size=_pool_size(config))
        on_retry = None
        endpoint = influx.metrics_endpoint
        if serve_metrics and endpoint is not None:
            metering.serve(endpoint)
            on_retry = metering.count_retry
        writers = _writers(config, writer, metered=on_retry is not None)
        ledger, reader = Ledger(db), StagedReader(db)
        targets = TargetLedger(db)
        deliveries = _deliveries(config, db, reader, writers, on_retry)
        rates = {t.name: t.config.target_catch_up_rate for t in influx.named_targets()}
        catch_up = CatchUp(db, ledger, reader, targets, list(deliveries.values()), rates=rates)
        promoter = Promoter(
            ledger,
            targets,
            list(deliveries.values()),
            catch_up,
            influx.min_targets,
            influx.retry_deadline_s,
        )
        roster = TargetRoster(
            targets, tuple((t.name, server_of(t.config.url)) for t in influx.named_targets())
        )
        gc = GarbageCollector(
            db,
            config.staging.retention_s,
            config.staging.orphan_grace_s,
            max_lag_s=influx.target_max_lag_s,
            max_backlog_bytes=influx.target_max_backlog_bytes,
            history_s=config.staging.history_retention_s,
        )
        handoff = Handoff(promoter) if influx.promotion == BACKGROUND else None
        auto_gc = AutoGc(gc, config.staging.gc_interval_s)
        committer = Committer(
            ledger, promoter, gc, handoff, auto_gc, roster=roster, catch_up=catch_up
        )
        return cls(
            config=config,
            db=db,
            writer=next(iter(writers.values())),
            stager=Stager(db, config.staging),
            ledger=ledger,
            reader=reader,
            promoter=promoter,
            committer=committer,
            gc=gc,
            runs=Runs(db),
            auto_gc=auto_gc,
            targets=targets,
            writers=writers,
            deliveries=deliveries,
            catch_up=catch_up,
            roster=roster,
        )

    def claim(self, sink_id: str, run_id: str, query_id: str | None) -> Lease:
        """Claim the sink for a run that starts (fencing older runs, I5) and promote what
        older runs left PRECOMMITTED
        ([`Committer.claim`][twophase.protocol.commit.committer.Committer.claim]).
        A driver of its own starts here; the ledger's
        [`Ledger.begin_run`][twophase.protocol.ledger.epoch_ledger.Ledger.begin_run] only claims."""
        return self.committer.claim(sink_id, run_id, query_id)

    def begin_run(self, sink_id: str, run_id: str, query_id: str | None) -> Lease:
        """Claim the sink for a run without recovering what older runs left
        ([`Ledger.begin_run`][twophase.protocol.ledger.epoch_ledger.Ledger.begin_run]), registering
        the configured targets as a query's claim does: for a caller that recovers by itself
        (its commits do) and watches no backlog."""
        lease = self.ledger.begin_run(sink_id, run_id, query_id)
        self.roster.register(lease)
        return lease

    def close(self) -> None:
        """Drain background promotions (raising the first failure), then disconnect."""
        try:
            self.committer.close()
        finally:
            for writer in self.writers.values():
                writer.close()
            self.ledger.close()
            self.db.close()

    def __enter__(self) -> TwoPhase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pool_size(config: TwoPhaseConfig) -> int | None:
    """The staging pool of a process promoting to several targets at once: a reader
    and a connection per lane for each, beside the caller's own steps (one target:
    the pool's default)."""
    targets = len(config.target.targets)
    return None if targets < 2 else 2 + targets * (1 + config.staging.lanes)


def _writers(
    config: TwoPhaseConfig, writer: TargetWriter | None, *, metered: bool
) -> dict[str, TargetWriter]:
    """A writer per target, by name; ``writer`` (given: shared pool or fault injection)
    stands for the first."""
    writers = {}
    for number, target in enumerate(config.target.named_targets()):
        made = writer if writer is not None and number == 0 else make_writer(target.config)
        writers[target.name] = metering.MeteredWriter(made, target.name) if metered else made
    return writers


def _deliveries(
    config: TwoPhaseConfig,
    db: Database,
    reader: StagedReader,
    writers: dict[str, TargetWriter],
    on_retry: Callable[[RetryEvent], None] | None,
) -> dict[str, TargetDelivery]:
    """A delivery per target, by name: its senders give up after ``target_deadline``
    (a commit's round) and after ``target_retry_deadline`` (everything else)."""
    deliveries = {}
    generations = TargetLedger(db)
    for target in config.target.named_targets():
        rounds = dataclasses.replace(
            target.config, retry_deadline_s=config.target.target_deadline_s
        )
        senders = (
            BatchSender(
                writers[target.name], rounds, on_attempt_failed=on_retry, deadline="target_deadline"
            ),
            BatchSender(writers[target.name], target.config, on_attempt_failed=on_retry),
        )
        deliveries[target.name] = TargetDelivery(
            target.name,
            reader,
            senders,
            DeadLetterLog(db),
            target.config,
            config.staging.lanes,
            db.retry,
            epochs=_epochs(target.config, writers[target.name]),
            generation=generations.generation,
        )
    return deliveries


def _epochs(target: TargetConfig, writer: TargetWriter) -> EpochWriter | None:
    """A transactional kind's writer, which takes each epoch in one transaction (its
    requests still go through ``writer``, metered); None for a kind that overwrites."""
    if not kind_of(target).transactional:
        return None
    inner = writer.inner if isinstance(writer, metering.MeteredWriter) else writer
    if not isinstance(inner, EpochWriter):
        raise TypeError(f"a transactional kind's writer must be an EpochWriter: {inner!r}")
    # A writer of an older contract would fail its first epoch's begin; told here, at
    # the start, with what it lacks.
    taken = inspect.signature(inner.begin).parameters.values()
    if not any(p.name == "generation" or p.kind == p.VAR_KEYWORD for p in taken):
        raise TypeError(
            f"a transactional kind's EpochWriter.begin must take the keyword `generation` "
            f"(its record keyed on it): {inner!r}"
        )
    return inner
