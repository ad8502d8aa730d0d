"""Dead letters split off a stream upstream of its sink, in the tasks that read it.

A job that classifies its input -- a ``reason`` column, null for a good row,
and a ``payload`` -- sends its bad rows to the dead-letter table exactly once
without a second query reading and parsing the input again:

    write = foreach_batch_writer("dash", ..., dead_letter_sink="dash.malformed")
    events = write.split_dead_letters(classified)       # good rows, without reason/payload
    stats = aggregate(events)
    stats.writeStream.foreachBatch(write)...

[`split_dead_letters`][twophase.spark.dead_letter_split.split_dead_letters] is one filter by a
(non-deterministic) Arrow UDF that sees only the ``reason`` and ``payload`` columns: the
good rows never leave the JVM (passing every column through a ``mapInArrow`` step instead
costs every batch a copy of every row to Python and back:
``git show f5c61bb^:bench/README.md``). Per task the UDF keeps the bad rows and, once
the task's input is exhausted, stages them as one write of the dead-letter sink, tagged
with the micro-batch (epoch), the run and the task's partition. No task result carries
that write to the driver, so the sink's commit decides the epoch of the dead-letter sink
first, from the writes its run staged, one per partition
([`StagedReader.partition_writes`][twophase.protocol.deliver.reader.StagedReader.partition_writes]):
every attempt of a partition's task reads the same input split and stages the same rows, all
or nothing, so any complete write stands for the partition. Writes of a crashed run or a
duplicate attempt are orphans that GC removes; a Spark replay of a decided epoch is detected
as for any sink.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from twophase.errors import ConfigError
from twophase.spark.options import PAYLOAD_COLUMN, REASON_COLUMN, SinkOptions, parse_options

_SPLIT = (REASON_COLUMN, PAYLOAD_COLUMN)
_KEEP = "_twophase_keep"


def split_dead_letters(df: Any, sink: SinkOptions | Mapping[str, str]) -> Any:
    """``df`` without its rows that have a ``reason``: those go to the sink's
    ``dead_letter_sink``. ``sink`` is the writer's options (the dict given to
    ``.options(...)`` of the ``twophase`` format, or parsed ones).

    ``df`` must have the string columns ``reason`` (null for a good row) and
    ``payload``; the result has every other column. Lazy, like any
    transformation: the rows are split when the query runs, in its first
    stage. The sink's writer must be the one this query writes through
    (it decides the dead-letter epochs), and the query must read every row
    of the result (an aggregation does; a ``limit`` would leave a task's bad
    rows unstaged). ConfigError when a column is missing.
    """
    if not isinstance(sink, SinkOptions):
        sink = parse_options(sink)
    dead = sink.dead_letters()
    fields = df.schema.fields  # one analysis of the plan
    missing = [column for column in _SPLIT if column not in {f.name for f in fields}]
    if missing:
        raise ConfigError(
            "dead_letter_sink",
            f"the rows to split need columns {', '.join(_SPLIT)}; missing: {', '.join(missing)}",
        )
    from pyspark.sql import functions as F

    # From the module that defines them: pyspark.sql.functions re-exports them implicitly,
    # which a strict type check does not follow.
    from pyspark.sql.pandas.functions import ArrowUDFType, arrow_udf

    udf = arrow_udf(_Splitter(dead), "boolean", ArrowUDFType.SCALAR_ITER)
    keep = udf.asNondeterministic()(*_SPLIT).alias(_KEEP)
    kept = [field.name for field in fields if field.name not in _SPLIT]
    # The UDF is a column of a projection, not a filter's condition: Spark pushes a
    # filter below the projections that compute its inputs and inlines them (the
    # classifying expressions, each parsing the line again); it cannot push the
    # filter on the result past a non-deterministic projection.
    return df.select("*", keep).where(F.col(_KEEP)).select(*kept)


class _Splitter:
    """The UDF's body (picklable: holds only the dead-letter sink's options)."""

    def __init__(self, dead: SinkOptions) -> None:
        self.dead = dead

    def __call__(self, batches: Iterable[tuple[Any, Any]]) -> Iterator[Any]:
        """``(reason, payload)`` Arrow arrays in, "keep this row" out, batch by batch."""
        import pyarrow.compute as pc

        bad: list[dict[str, Any]] = []
        for reason, payload in batches:
            good = pc.is_null(reason)
            if len(reason) and not pc.all(good).as_py():
                rejected = pc.invert(good)
                reasons = reason.filter(rejected).to_pylist()
                payloads = payload.filter(rejected).to_pylist()
                bad += [
                    {REASON_COLUMN: r, PAYLOAD_COLUMN: p}
                    for r, p in zip(reasons, payloads, strict=True)
                ]
            yield good
        if bad:  # before the task ends: a failed staging fails (and retries) the task
            # Imported only now: a task without bad rows (most of them) opens no pool and
            # imports no staging code in its Python worker.
            from twophase.spark.staging_task import current_task, stage_task

            stage_task(self.dead, bad, current_task())
