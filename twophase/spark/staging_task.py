"""Phase 1 inside a Spark task: the rows of one partition become one staged write.

Runs on executors. Reads the epoch, run id and query id from the task's
context (the local properties Spark sets for a streaming micro-batch, or
under Spark Connect the foreachBatch writer's job tag), turns
the rows into line-protocol lines or dead letters, and stages them through
[`twophase.protocol.stage.stager.Stager`][twophase.protocol.stage.stager.Stager] over the process's
shared connection pool.
Nothing reaches a target here. Every call makes a new write: a retried task
stages again, and only the write whose message reaches the driver's vote
counts; the others are orphans that abort or GC removes.
"""

from __future__ import annotations

import os
import pickle
import random
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark import TaskContext

from twophase.errors import PermanentError
from twophase.model import CommitMessage
from twophase.points.builder import MAX_PAYLOAD_BYTES, PointBuilder, Rejected
from twophase.points.columnar import ColumnarEncoder, one_value
from twophase.protocol.stage.stager import Stager
from twophase.spark.options import PAYLOAD_COLUMN, REASON_COLUMN, SinkOptions
from twophase.store.database import shared_database

# Local properties Spark sets on every job of a streaming micro-batch.
BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"
RUN_ID_PROPERTY = "spark.jobGroup.id"
# Under Spark Connect a foreachBatch batch runs its jobs from the server's Python, on a
# thread without the streaming properties; the writer tags them instead (one job tag,
# which Spark passes to every task in ``spark.job.tags``): see batch_tag().
JOB_TAGS_PROPERTY = "spark.job.tags"
_BATCH_TAG = re.compile(r"twophase-batch:(\d+):([^:,]+):([^,]+)")
_TRUNCATED = " ...[truncated]"
MESSAGE_SCHEMA = "message binary"  # what a staging task of the foreachBatch adapter returns


@dataclass(frozen=True)
class TaskIdentity:
    """Who is staging: the epoch, the task's partition and attempt, the run and query."""

    epoch: int
    partition_id: int
    attempt: int
    run_id: str | None
    query_id: str | None


def current_task(
    epoch: int | None = None, run_id: str | None = None, query_id: str | None = None
) -> TaskIdentity:
    """The identity of the running task; explicit values win over local properties.

    Raises [`PermanentError`][twophase.errors.PermanentError] outside a Spark task, or when
    no epoch is given and the task is not part of a streaming micro-batch.
    """
    ctx = TaskContext.get()
    if ctx is None:
        raise PermanentError("twophase staging must run inside a Spark task")
    batch = ctx.getLocalProperty(BATCH_ID_PROPERTY)
    tagged = _BATCH_TAG.search(ctx.getLocalProperty(JOB_TAGS_PROPERTY) or "")
    if batch is None and tagged is not None:  # a foreachBatch batch under Spark Connect
        batch = tagged.group(1)
        run_id, query_id = run_id or tagged.group(2), query_id or tagged.group(3)
    if epoch is None:
        if batch is None:
            raise PermanentError(
                "the task has no streaming batch id: the twophase sink works in "
                "streaming queries only (df.writeStream...), not in batch writes"
            )
        epoch = int(batch)
    return TaskIdentity(
        epoch=epoch,
        partition_id=ctx.partitionId(),
        attempt=ctx.attemptNumber(),
        run_id=run_id or ctx.getLocalProperty(RUN_ID_PROPERTY),
        query_id=query_id or ctx.getLocalProperty(QUERY_ID_PROPERTY),
    )


def batch_tag(epoch: int, run_id: str, query_id: str) -> str:
    """The job tag that tells a task under Spark Connect its batch, run and query."""
    return f"twophase-batch:{epoch}:{run_id}:{query_id}"


def stage_task(sink: SinkOptions, data: Iterable[Any], task: TaskIdentity) -> CommitMessage:
    """Stage one partition's rows (Arrow record batches, PySpark rows (``Row``) or mappings:
    see [`items_of`][twophase.spark.staging_task.items_of]) as one write.

    All or nothing (one PostgreSQL transaction); returns the message the
    driver's vote needs. A staging store that is down or lost mid-way is
    waited for and the staging repeated (up to ``staging_retry_deadline``),
    from a spool in Spark's local directory; other staging errors propagate,
    failing the task, which Spark may retry.
    """
    config = sink.staging_config()
    stager = Stager(shared_database(config), config, spool_dir=local_dir())
    return stager.stage(
        sink.sink_id,
        task.epoch,
        items_of(sink, data),
        partition_id=task.partition_id,
        attempt=task.attempt,
        run_id=task.run_id,
        query_id=task.query_id,
    )


def local_dir() -> str | None:
    """A directory of Spark's for a task's temporary files: one of ``SPARK_LOCAL_DIRS``,
    which Spark gives its Python workers (the executor's disks for scratch data, where
    its shuffle spills too), chosen at random to spread tasks over them as PySpark's own
    spills do; None (the system's temporary directory) outside Spark."""
    found = [d for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(",") if os.path.isdir(d)]
    return random.choice(found) if found else None


def rows_of(data: Iterable[Any]) -> Iterator[Mapping[str, Any]]:
    """Rows as mappings, lazily: one Arrow record batch (or one Row) at a time."""
    for item in data:
        to_pylist = getattr(item, "to_pylist", None)
        if to_pylist is not None:  # a pyarrow.RecordBatch
            yield from to_pylist()
        elif isinstance(item, Mapping):
            yield item
        else:  # a pyspark.sql.Row (row-based writer on PySpark 4.0)
            yield item.asDict()


def items_of(
    sink: SinkOptions, data: Iterable[Any], *, columnar: bool = True
) -> Iterable[str | Rejected]:
    """One line or one Rejected per row, in order (never drops a row). ``data``: Arrow
    record batches, PySpark rows (``Row``) or mappings, mixed. Record batches are encoded a
    column at a time ([`ColumnarEncoder`][twophase.points.columnar.ColumnarEncoder], the
    same lines and dead letters as the row builder's); ``columnar=False`` takes every row
    through the row builder. The dead letters of rows in a list come as a list: staging
    repeats it without spooling it."""
    if sink.spec is None:
        letters = dead_letters(rows_of(data))
        return list(letters) if isinstance(data, list | tuple) else letters
    builder = PointBuilder(
        sink.spec, unsigned=sink.writes_unsigned(), allow_newlines=sink.allows_newlines()
    )
    if not columnar:
        return builder.convert(rows_of(data))
    return ColumnarEncoder(builder).convert(data)


def dead_letters(rows: Iterable[Mapping[str, Any]]) -> Iterator[Rejected]:
    """Each row as a dead letter with its ``reason`` and ``payload`` (dead_letters mode)."""
    for index, row in enumerate(rows):
        reason = storable(row.get(REASON_COLUMN)) or "no reason given"
        yield Rejected(index, reason, storable(row.get(PAYLOAD_COLUMN)))


def storable(value: Any) -> str:
    """Text PostgreSQL can hold: NUL shown as ``\\x00``, cut to the payload limit."""
    if value is None:
        return ""
    text = str(value).replace("\x00", "\\x00")
    data = text.encode("utf-8", "backslashreplace")
    if len(data) <= MAX_PAYLOAD_BYTES:
        return data.decode("utf-8")
    cut = data[: MAX_PAYLOAD_BYTES - len(_TRUNCATED)]
    return cut.decode("utf-8", "ignore") + _TRUNCATED


def stage_arrow_partition(
    sink: SinkOptions,
    epoch: int,
    run_id: str,
    query_id: str | None,
    batches: Iterable[Any],
) -> Iterator[Any]:
    """``mapInArrow`` body of the foreachBatch adapter: stage this partition, yield its
    pickled CommitMessage (one row of
    [`MESSAGE_SCHEMA`][twophase.spark.staging_task.MESSAGE_SCHEMA])."""
    import pyarrow as pa

    task = current_task(epoch=epoch, run_id=run_id, query_id=query_id)
    # Built from its bytes: pyarrow's conversion of a Python list imports pandas here.
    column = one_value(pa.binary(), pickle.dumps(stage_task(sink, batches, task)))
    yield pa.RecordBatch.from_arrays([column], names=["message"])
