"""Assembles the protocol's parts from one configuration.

``TwoPhase.open(config)`` checks the staging schema, resolves the InfluxDB
API, and wires stager, ledger, promoter, committer and GC. The Spark sink,
the jobs and the CLI all start here, so they share one set of defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

from twophase.committer import Committer, Promoter
from twophase.config import TwoPhaseConfig
from twophase.db import Database
from twophase.gc import GarbageCollector
from twophase.influx import InfluxWriter, make_writer
from twophase.ledger import Ledger
from twophase.sender import BatchSender
from twophase.staging import StagedReader, Stager


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

    @classmethod
    def open(
        cls,
        config: TwoPhaseConfig,
        db: Database | None = None,
        writer: InfluxWriter | None = None,
    ) -> TwoPhase:
        """Connect, check the schema (SchemaError when behind) and wire the parts.

        ``db`` and ``writer`` default to ones made from ``config``; passing them
        shares a pool, or wraps the writer (metrics, fault injection in tests).
        """
        db = db or Database(config.staging)
        writer = writer or make_writer(config.influx)
        sender = BatchSender.from_config(writer, config.influx)
        ledger, reader, stager = Ledger(db), StagedReader(db), Stager(db)
        promoter = Promoter(
            ledger, reader, sender, config.influx.batch_points, config.influx.batch_bytes
        )
        return cls(
            config=config,
            db=db,
            writer=writer,
            stager=stager,
            ledger=ledger,
            reader=reader,
            promoter=promoter,
            committer=Committer(ledger, promoter, stager),
            gc=GarbageCollector(db, config.staging.retention_s, config.staging.orphan_grace_s),
        )

    def close(self) -> None:
        self.writer.close()
        self.db.close()

    def __enter__(self) -> TwoPhase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
