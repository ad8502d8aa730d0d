"""Assembles the protocol's parts from one configuration.

``TwoPhase.open(config)`` checks the staging schema, resolves the InfluxDB
API, and wires stager, ledger, promoter, committer, GC (by an operator, and
automatic after commits) and the runs' ends.
The Spark sink, the jobs and the CLI all start here, so they share one set
of defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

from twophase.config import BACKGROUND, TwoPhaseConfig
from twophase.influx import metering
from twophase.influx.api import make_writer
from twophase.influx.sender import BatchSender
from twophase.influx.writers import InfluxWriter
from twophase.model import Lease
from twophase.protocol.autogc import AutoGc
from twophase.protocol.committer import Committer
from twophase.protocol.deadletters import DeadLetterLog
from twophase.protocol.gc import GarbageCollector
from twophase.protocol.handoff import Handoff
from twophase.protocol.ledger import Ledger
from twophase.protocol.promoter import Promoter
from twophase.protocol.reader import StagedReader
from twophase.protocol.runs import Runs
from twophase.protocol.stager import Stager
from twophase.store.database import Database


@dataclass(frozen=True)
class TwoPhase:
    """The driver-side parts over one staging database and one InfluxDB."""

    config: TwoPhaseConfig
    db: Database
    writer: InfluxWriter
    stager: Stager
    ledger: Ledger
    reader: StagedReader
    promoter: Promoter
    committer: Committer
    gc: GarbageCollector
    runs: Runs
    auto_gc: AutoGc

    @classmethod
    def open(
        cls,
        config: TwoPhaseConfig,
        db: Database | None = None,
        writer: InfluxWriter | None = None,
        *,
        serve_metrics: bool = False,
    ) -> TwoPhase:
        """Connect, check the schema (SchemaError when behind) and wire the parts.

        ``db`` and ``writer`` default to ones made from ``config``; passing them
        shares a pool, or wraps the writer (fault injection in tests). With
        ``serve_metrics`` (the Spark driver) and ``metrics_port`` set, the
        writer is metered and this process serves its metrics there
        (:mod:`twophase.influx.metering`); the CLI never does, so an operator's
        shell holding the job's environment does not take the driver's port.
        """
        db = db or Database(config.staging)
        writer = writer or make_writer(config.influx)
        on_retry = None
        if serve_metrics and config.influx.metrics_port is not None:
            metering.serve(config.influx.metrics_port)
            writer, on_retry = metering.MeteredWriter(writer), metering.count_retry
        ledger, reader = Ledger(db), StagedReader(db)
        sender = BatchSender(writer, config.influx, on_attempt_failed=on_retry)
        promoter = Promoter(
            ledger,
            reader,
            sender,
            DeadLetterLog(db),
            config.influx,
            config.staging.lanes,
            retry=db.retry,
        )
        gc = GarbageCollector(db, config.staging.retention_s, config.staging.orphan_grace_s)
        handoff = Handoff(promoter) if config.influx.promotion == BACKGROUND else None
        auto_gc = AutoGc(gc, config.staging.gc_interval_s)
        return cls(
            config=config,
            db=db,
            writer=writer,
            stager=Stager(db, config.staging),
            ledger=ledger,
            reader=reader,
            promoter=promoter,
            committer=Committer(ledger, promoter, gc, handoff, auto_gc),
            gc=gc,
            runs=Runs(db),
            auto_gc=auto_gc,
        )

    def claim(self, sink_id: str, run_id: str, query_id: str | None) -> Lease:
        """Claim the sink for a run that starts (fencing older runs, I5) and promote what
        older runs left PRECOMMITTED (:meth:`Committer.claim`). A driver of its own
        starts here; :meth:`Ledger.begin_run` only claims."""
        return self.committer.claim(sink_id, run_id, query_id)

    def close(self) -> None:
        """Drain background promotions (raising the first failure), then disconnect."""
        try:
            self.committer.close()
        finally:
            self.writer.close()
            self.db.close()

    def __enter__(self) -> TwoPhase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
