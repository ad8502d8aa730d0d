"""The ``twophase`` Python data source: a streaming sink with a two-phase commit.

    twophase.spark.register(spark)
    (df.writeStream.format("twophase")
       .option("sink_id", "dashboard")
       .option("measurement", "stream_stats")
       .option("tags", "stream_id,isp")
       .option("time", "window_end").option("precision", "s")
       .option("checkpointLocation", "/chk/dashboard")
       .outputMode("update").start())

Where each method runs and what it does:

* ``streamWriter`` (driver, once per micro-batch in a planning process, and
  in the commit process): parses and validates the options and the output
  schema; a mistake fails ``start()`` with a ConfigError naming the option.
* ``write`` (executors, one call per task): phase 1, stages the task's rows
  in PostgreSQL and returns a
  [`TwoPhaseCommitMessage`][twophase.spark.source.TwoPhaseCommitMessage].
* ``commit`` (driver, after every task of the micro-batch succeeded):
  recovers older PRECOMMITTED epochs, decides this one, promotes it to
  its targets and marks it COMMITTED. Only after it returns does Spark write its
  own commit log; a crash in between makes Spark replay the batch, which the
  ledger detects.
* ``abort`` (driver, when a task failed): discards the staged writes.

On PySpark 4.1+ the writer receives Arrow record batches
(``DataSourceStreamArrowWriter``); on 4.0 it falls back to rows.

``twophase-influx``, the format's name while InfluxDB was its only kind of target, is
the same sink under its former name until 0.12.0; a process that uses it logs a
warning once.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, WriterCommitMessage

from twophase import logs
from twophase.config import BACKGROUND
from twophase.deprecation import REMOVED_IN
from twophase.errors import ConfigError, PermanentError
from twophase.model import CommitMessage
from twophase.spark.options import SinkOptions, check_schema, parse_options

try:  # PySpark 4.1+: Arrow record batches straight from the JVM
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriter
except ImportError:  # pragma: no cover - PySpark 4.0: Spark Rows
    from pyspark.sql.datasource import (  # type: ignore[assignment]
        DataSourceStreamWriter as _StreamWriter,
    )

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

FORMAT = "twophase"
FORMER_FORMAT = "twophase-influx"
log = logging.getLogger("twophase.spark")


@dataclass(frozen=True)
class TwoPhaseCommitMessage(WriterCommitMessage):
    """What one task sends to the driver: its staged write (picklable)."""

    message: CommitMessage


class TwoPhaseStreamWriter(_StreamWriter):
    """Stages on executors, decides and promotes on the driver. Holds only plain options."""

    def __init__(self, sink: SinkOptions) -> None:
        self.sink = sink

    def write(self, iterator: Iterator[Any]) -> TwoPhaseCommitMessage:
        """Phase 1 for this task's rows; the epoch and run come from the task context."""
        from twophase.spark.staging_task import current_task, stage_task

        return TwoPhaseCommitMessage(stage_task(self.sink, iterator, current_task()))

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        """Decide and promote epoch ``batchId``; raising fails the query before Spark
        records the batch, so a restart replays it."""
        # Imported here, as staging is in write(): each Python worker that unpickles this
        # writer (planning, staging, committing) imports only what its own step needs,
        # and the driver's protocol is most of the sink's imports.
        from twophase.spark.driver_commit import commit_epoch

        commit_epoch(self.sink, batchId, _staged(messages, strict=True))

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        """Discard what the successful tasks of a failed attempt staged."""
        from twophase.spark.driver_commit import abort_epoch

        abort_epoch(self.sink, batchId, _staged(messages, strict=False))


class TwoPhaseDataSource(DataSource):
    """``format("twophase")``: a streaming sink only (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def streamWriter(self, schema: StructType, overwrite: bool) -> TwoPhaseStreamWriter:
        sink = parse_options(self.options)
        if sink.log_format is not None:  # this process runs the commit: its lines go here
            logs.configure(sink.log_format)
        check_schema(sink, schema.fieldNames())
        if sink.config().target.promotion == BACKGROUND:
            # pyspark/sql/worker/python_streaming_sink_runner.py: one worker run per commit
            raise ConfigError(
                "promotion",
                "background promotion needs a driver process that outlives the commit; this "
                "sink's commit runs in a Python worker that Spark may end once it returns, "
                "cutting the promotion: use promotion=inline, or the foreachBatch adapter",
            )
        return TwoPhaseStreamWriter(sink)

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        raise ConfigError(
            "format",
            f"{self.name()} is a streaming sink (df.writeStream); a batch DataFrame has no "
            "epochs to commit exactly once",
        )


class TwoPhaseInfluxDataSource(TwoPhaseDataSource):
    """``format("twophase-influx")``: the former name of ``format("twophase")``, the
    same sink, which logs a warning once per process until the name goes.

    A class of its own because Spark finds a Python data source by the name its
    class gives (``name()``), and checks that name again in the Python worker."""

    @classmethod
    def name(cls) -> str:
        return FORMER_FORMAT

    def streamWriter(self, schema: StructType, overwrite: bool) -> TwoPhaseStreamWriter:
        writer = super().streamWriter(schema, overwrite)
        _warn_former_format()  # after the sink's log_format took effect: the line goes there
        return writer


@functools.cache  # once per process: a Python worker plans every micro-batch
def _warn_former_format() -> None:
    log.warning(
        "format(%r) is deprecated: use format(%r), the same sink; %r goes in twophase %s",
        FORMER_FORMAT,
        FORMAT,
        FORMER_FORMAT,
        REMOVED_IN,
    )


def register(spark: Any) -> None:
    """Make ``format("twophase")`` available in this Spark session (idempotent), and
    its former name ``format("twophase-influx")`` until that goes.

    Warns here of a master that retries no failed task: the sink's commit runs in a
    Python worker, which cannot read the master."""
    from twophase.spark.master_retries import warn_without_task_retries

    spark.dataSource.register(TwoPhaseDataSource)
    spark.dataSource.register(TwoPhaseInfluxDataSource)
    warn_without_task_retries()


def _staged(messages: Sequence[WriterCommitMessage | None], strict: bool) -> list[CommitMessage]:
    """The CommitMessages; with ``strict``, a missing or foreign message is an error."""
    staged = []
    for message in messages:
        if isinstance(message, TwoPhaseCommitMessage):
            staged.append(message.message)
        elif strict:
            raise PermanentError(
                f"a task of the {FORMAT} sink returned {type(message).__name__}, "
                "not a staged write; the epoch cannot be decided"
            )
    return staged
