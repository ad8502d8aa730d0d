"""The same two-phase commit for pipelines built on ``foreachBatch``.

::

    write = twophase.spark.foreach_batch_writer(
        "dashboard", measurement="stream_stats", tags=["stream_id", "isp"],
        time="window_end", precision="s")
    df.writeStream.foreachBatch(write).option("checkpointLocation", ...).start()

The function runs on the driver once per micro-batch with the batch
DataFrame and ``batch_id``. It stages the DataFrame's partitions in Spark
tasks (``mapInArrow``), collects their messages, then decides and promotes
the epoch exactly as the data source's ``commit`` does.

Where the ids come from: ``batch_id`` is the epoch. The query id and run id
are the driver's local properties ``sql.streaming.queryId`` and
``spark.jobGroup.id``, which Spark sets on the thread that calls the
function (read through ``df.sparkSession.sparkContext.getLocalProperty``;
seen on PySpark 4.3 with classic Spark). Where they are not available
(Spark Connect has no SparkContext), the run id is one fresh id per
adapter (per driver start) and the query id is the ``query_id`` argument:
pass a stable one, or the sink cannot refuse a reset checkpoint (I6).
"""

from __future__ import annotations

import functools
import logging
import pickle
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from twophase.points import PointSpec
from twophase.spark.commit import commit_epoch
from twophase.spark.options import DEAD_LETTERS, POINTS, SinkOptions, build_sink, check_schema
from twophase.spark.stage import (
    QUERY_ID_PROPERTY,
    RUN_ID_PROPERTY,
    current_task,
    stage_task,
)

log = logging.getLogger("twophase.spark")
MESSAGE_SCHEMA = "message binary"


def foreach_batch_writer(
    sink_id: str,
    *,
    measurement: str | None = None,
    tags: Sequence[str] = (),
    fields: Sequence[str] | None = None,
    time: str | None = None,
    precision: str = "ns",
    null_fields: str = "reject",
    mode: str = POINTS,
    query_id: str | None = None,
    **settings: Any,
) -> Callable[[Any, int], None]:
    """A ``foreachBatch`` function writing each micro-batch exactly once.

    Arguments mean what the data source's options mean; ``settings`` are the
    ``TWOPHASE_*`` settings by lower-case name (secrets refused). Validates
    everything now, on the driver: raises ConfigError naming the argument.
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
        )
    given = (
        []
        if mode != DEAD_LETTERS
        else _given_point_arguments(
            measurement=measurement, tags=tags or None, fields=fields, time=time
        )
    )
    sink = build_sink(sink_id, mode, spec, settings, given)
    return functools.partial(_write_batch, sink, uuid.uuid4().hex, query_id)


def _given_point_arguments(**values: Any) -> list[str]:
    return [name for name, value in values.items() if value is not None]


def _write_batch(
    sink: SinkOptions, fallback_run_id: str, fallback_query_id: str | None, df: Any, batch_id: int
) -> None:
    """Stage the batch in Spark tasks, then decide and promote it on the driver."""
    check_schema(sink, df.columns)
    run_id, query_id = _driver_ids(df, fallback_run_id, fallback_query_id)
    stage = functools.partial(_stage_partition, sink, batch_id, run_id, query_id)
    rows = df.mapInArrow(stage, MESSAGE_SCHEMA).collect()
    commit_epoch(sink, batch_id, [pickle.loads(row.message) for row in rows])


def _driver_ids(
    df: Any, fallback_run_id: str, fallback_query_id: str | None
) -> tuple[str, str | None]:
    """The streaming query's run and query ids from the driver's local properties."""
    properties: Mapping[str, str | None] = {}
    try:
        context = df.sparkSession.sparkContext
        properties = {
            name: context.getLocalProperty(name) for name in (RUN_ID_PROPERTY, QUERY_ID_PROPERTY)
        }
    except Exception:  # Spark Connect: no SparkContext on the client
        log.warning(
            "no SparkContext: using run id %s and query id %s", fallback_run_id, fallback_query_id
        )
    run_id = properties.get(RUN_ID_PROPERTY) or fallback_run_id
    return run_id, properties.get(QUERY_ID_PROPERTY) or fallback_query_id


def _stage_partition(
    sink: SinkOptions,
    epoch: int,
    run_id: str,
    query_id: str | None,
    batches: Iterable[Any],
) -> Iterator[Any]:
    """``mapInArrow`` body: stage this partition, yield its pickled CommitMessage."""
    import pyarrow as pa

    task = current_task(epoch=epoch, run_id=run_id, query_id=query_id)
    message = stage_task(sink, batches, task)
    yield pa.RecordBatch.from_pydict({"message": [pickle.dumps(message)]})
