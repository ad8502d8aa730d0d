"""The same two-phase commit for pipelines built on ``foreachBatch``.

    write = twophase.spark.foreach_batch_writer(
        "dashboard", measurement="stream_stats", tags=["stream_id", "isp"],
        time="window_end", precision="s")
    df.writeStream.foreachBatch(write).option("checkpointLocation", ...).start()

The function runs on the driver once per micro-batch with the batch
DataFrame and ``batch_id``. A batch that Spark's plan estimates at
``driver_staging_bytes`` or less is collected once (``toArrow``) and staged
from the driver as one write; a larger one is staged in Spark tasks, a write
per partition (``mapInArrow``), and their messages collected (as is a batch
whose collect outgrows ``spark.driver.maxResultSize``). The epoch is
then decided and promoted exactly as the data source's ``commit`` does. Both
ways stage the same points; a crash at any step leaves orphans that GC
removes, and the replay stages the batch again.

Where the ids come from: ``batch_id`` is the epoch. The query id and run id
are the driver's local properties ``sql.streaming.queryId`` and
``spark.jobGroup.id``, which Spark sets on the thread that calls the
function (read through ``df.sparkSession.sparkContext.getLocalProperty``;
seen on PySpark 4.3 with classic Spark).

Under Spark Connect the function runs in a Python process of the server,
with a Connect session and neither a SparkContext nor those properties
(seen on PySpark 4.3: no query id in the session's configuration, its
``streams`` empty, no streaming property in the tasks it starts). The run
id is then the writer's own (one fresh id per writer, made on the client),
and the query id comes from the client, which knows it once ``start()``
returns:

    query = df.writeStream.foreachBatch(write).start()
    twophase.spark.claim_query(query, write)

The function decides nothing until that claim is recorded (I6 holds: a
reset checkpoint gives a new query id, which the claim refuses), and fails
the query with ConfigError after ``CLAIM_WAIT_S`` without one. Passing
``query_id=`` (a stable id of your own) replaces the claim.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import pickle
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from twophase.config import BACKGROUND
from twophase.errors import ConfigError, PermanentError
from twophase.model import CommitMessage
from twophase.points.builder import PointSpec
from twophase.spark.dead_letter_split import split_dead_letters
from twophase.spark.driver_commit import (
    await_claim,
    commit_epoch,
    open_in_background,
    two_phase,
)
from twophase.spark.options import DEAD_LETTERS, POINTS, SinkOptions, build_sink, check_schema
from twophase.spark.staging_task import (
    MESSAGE_SCHEMA,
    QUERY_ID_PROPERTY,
    RUN_ID_PROPERTY,
    batch_tag,
    items_of,
    stage_arrow_partition,
)

log = logging.getLogger("twophase.spark")
# The setting Spark names when a collect outgrows it (the whole job fails).
_RESULT_SIZE = "spark.driver.maxResultSize"


def foreach_batch_writer(
    sink_id: str,
    *,
    measurement: str | None = None,
    measurement_column: str | None = None,
    tags: Sequence[str] = (),
    fields: Sequence[str] | None = None,
    time: str | None = None,
    precision: str = "ns",
    null_fields: str = "reject",
    mode: str = POINTS,
    query_id: str | None = None,
    dead_letter_sink: str | None = None,
    **settings: Any,
) -> ForeachBatchWriter:
    """A ``foreachBatch`` function writing each micro-batch exactly once.

    Arguments mean what the data source's options mean (exactly one of ``measurement``
    and ``measurement_column``); ``settings`` are the ``TWOPHASE_*``
    settings by lower-case name (secrets refused). With ``dead_letter_sink``, rows split off
    upstream through the writer's
    [`split_dead_letters`][twophase.spark.foreach.ForeachBatchWriter.split_dead_letters] are
    decided under that sink in the same micro-batch. Validates everything now, on the
    driver: raises ConfigError naming the argument.
    """
    spec = None
    if mode == POINTS:
        spec = PointSpec(
            measurement=measurement or "",
            tag_columns=tuple(tags),
            field_columns=None if fields is None else tuple(fields),
            time_column=time,
            precision=precision,
            null_fields=null_fields,
            measurement_column=measurement_column,
        )
    given = (
        []
        if mode != DEAD_LETTERS
        else _given_point_arguments(
            measurement=measurement,
            measurement_column=measurement_column,
            tags=tags or None,
            fields=fields,
            time=time,
        )
    )
    sink = build_sink(sink_id, mode, spec, settings, given, dead_letter_sink)
    open_in_background(sink)  # while Spark plans the query: the first batch finds it open
    return ForeachBatchWriter(sink, uuid.uuid4().hex, query_id)


class ForeachBatchWriter:
    """``foreachBatch(writer)``: stage the batch in Spark tasks, then decide and promote
    it on the driver. Idempotent per batch id: a Spark replay is detected."""

    def __init__(self, sink: SinkOptions, fallback_run_id: str, query_id: str | None) -> None:
        self.sink = sink
        self._fallback = (fallback_run_id, query_id)

    def __call__(self, df: Any, batch_id: int) -> None:
        _write_batch(self.sink, *self._fallback, df, batch_id)

    def run_of(self, query: Any) -> str:
        """The run id this writer's batches of ``query`` decide under: the query's
        ``runId`` with classic Spark, the writer's own under Spark Connect."""
        return self._fallback[0] if is_connect(query) else str(query.runId)

    def split_dead_letters(self, df: Any) -> Any:
        """``df`` without its rows that have a ``reason`` (see
        [`twophase.spark.dead_letter_split`][twophase.spark.dead_letter_split]);
        those are recorded under this writer's ``dead_letter_sink``."""
        return split_dead_letters(df, self.sink)


def _given_point_arguments(**values: Any) -> list[str]:
    return [name for name, value in values.items() if value is not None]


def _write_batch(
    sink: SinkOptions, fallback_run_id: str, fallback_query_id: str | None, df: Any, batch_id: int
) -> None:
    """Stage the batch in Spark tasks, then decide and promote it on the driver."""
    check_schema(sink, df.columns)
    driver = _Driver.of(df, fallback_run_id, fallback_query_id)
    if driver.remote and sink.config().target.promotion == BACKGROUND:
        raise ConfigError(
            "promotion",
            "under Spark Connect the server ends the foreachBatch function's process with its "
            "query, which would cut a background promotion: use promotion=inline",
        )
    if driver.remote and driver.query_id is None:  # the client claims with the query id
        driver = replace(driver, query_id=await_claim(sink, driver.run_id))
    started = time.perf_counter()
    with driver.tagged(df, batch_id):
        messages = _stage(sink, driver, df, batch_id)
    identity = (driver.run_id, driver.query_id)
    commit_epoch(sink, batch_id, messages, identity, time.perf_counter() - started)


def _stage(sink: SinkOptions, driver: _Driver, df: Any, batch_id: int) -> list[CommitMessage]:
    """The batch's writes: one, staged here after one collect, when Spark's plan puts the
    batch at ``driver_staging_bytes`` or less (the one Spark job a plain writer runs,
    without a Python stage); otherwise one per partition, staged by Spark tasks."""
    parts = two_phase(sink)
    small = driver.is_small(df, parts.config.staging.driver_staging_bytes)
    table = _collected(df, batch_id) if small else None
    if table is not None:
        items = items_of(sink, table.to_batches())
        return [
            parts.stager.stage(
                sink.sink_id, batch_id, items, run_id=driver.run_id, query_id=driver.query_id
            )
        ]
    stage = functools.partial(stage_arrow_partition, sink, batch_id, driver.run_id, driver.query_id)
    rows = driver.tasks(df).mapInArrow(stage, MESSAGE_SCHEMA).collect()
    return [message_of(row.message) for row in rows]


def _collected(df: Any, batch_id: int) -> Any:
    """The batch as one Arrow table, or None when it outgrew Spark's estimate past
    ``spark.driver.maxResultSize``: nothing was staged or decided by that job (the rows
    split off upstream were, and a partition's second write of them is an orphan), so
    the batch is staged in tasks instead."""
    try:
        return df.toArrow()
    except Exception as exc:
        if _RESULT_SIZE not in str(exc):
            raise
        log.warning(
            "micro-batch %d is larger than Spark estimated (past %s): staged in tasks",
            batch_id,
            _RESULT_SIZE,
        )
        return None


def message_of(data: bytes) -> CommitMessage:
    """A staging task's pickled message (its format is checked by the commit). A pickle
    this twophase cannot even load (an executor of another version: a class moved or
    renamed) is a PermanentError saying so, not an AttributeError from deep in pickle."""
    try:
        message = pickle.loads(data)
    except (AttributeError, ImportError, TypeError, pickle.UnpicklingError) as exc:
        raise PermanentError(
            f"cannot read a commit message from an executor ({type(exc).__name__}: {exc}): "
            "run the same twophase version on the driver and the executors"
        ) from None
    if not isinstance(message, CommitMessage):
        raise PermanentError(
            f"a staging task returned {type(message).__name__}, not a commit message: "
            "run the same twophase version on the driver and the executors"
        )
    return message


@dataclass(frozen=True)
class _Driver:
    """What the driver knows of the running batch: the run, the query, the cores."""

    run_id: str
    query_id: str | None
    cores: int | None
    remote: bool  # a Spark Connect server's Python: no SparkContext

    @classmethod
    def of(cls, df: Any, fallback_run_id: str, fallback_query_id: str | None) -> _Driver:
        """The run and query ids are the driver's local properties of the streaming query."""
        try:
            context = df.sparkSession.sparkContext
            run_id, query_id = map(context.getLocalProperty, (RUN_ID_PROPERTY, QUERY_ID_PROPERTY))
            cores, remote = int(context.defaultParallelism), False
        except Exception:  # Spark Connect: no SparkContext in the server's Python
            log.debug("no SparkContext: run id %s, query id %s", fallback_run_id, fallback_query_id)
            run_id = query_id = cores = None
            remote = True
        return cls(run_id or fallback_run_id, query_id or fallback_query_id, cores, remote)

    @contextlib.contextmanager
    def tagged(self, df: Any, batch_id: int) -> Iterator[None]:
        """Under Spark Connect, tag the batch's jobs with its identity: the tasks upstream
        that split dead letters off read it there
        ([`current_task`][twophase.spark.staging_task.current_task])."""
        if not self.remote:  # classic Spark: the streaming properties carry it
            yield
            return
        tag = batch_tag(batch_id, self.run_id, str(self.query_id))
        df.sparkSession.addTag(tag)
        try:
            yield
        finally:
            df.sparkSession.removeTag(tag)

    def is_small(self, df: Any, limit: int) -> bool:
        """Spark's estimate of the batch's size (the optimizer's, which the collect
        reuses) is at most ``limit`` bytes. Never under Spark Connect, nor without an
        estimate: the batch is then staged in tasks."""
        if limit <= 0 or self.remote:
            return False
        try:
            size = int(df._jdf.queryExecution().optimizedPlan().stats().sizeInBytes())
        except Exception:  # no estimate from this Spark: the tasks' path, always right
            log.debug("no size estimate for the batch: staged in tasks", exc_info=True)
            return False
        log.debug("the batch is estimated at %d bytes (driver_staging_bytes %d)", size, limit)
        return size <= limit

    def tasks(self, df: Any) -> Any:
        """``df`` in at most one partition per core: staging tasks beyond the cores only
        wait for a second wave, which adds its time to every micro-batch
        (the study "Staging tasks per shuffle partition" in
        ``git show f5c61bb^:bench/README.md``)."""
        return df if self.cores is None else df.coalesce(self.cores)


def is_connect(query: Any) -> bool:
    """``query`` is a Spark Connect client's handle (its batches run on the server)."""
    return type(query).__module__.startswith("pyspark.sql.connect")
