"""``jobs/session_metrics.py`` with a plain at-least-once ``foreachBatch``: metric 6's direct side.

::

    python -m bench.spark_direct [--stats-sink direct|twophase] --input DIR --checkpoint DIR \
        --sink-id NAME --available-now ...

The same options, input, parsing, aggregation, session settings and
``PROGRESS`` lines as the job (its functions are reused); only the writers
differ. The stats query's ``foreachBatch`` converts each partition's rows to
line protocol in Spark tasks (``mapInArrow``, as twophase's staging does, with
the same :class:`twophase.points.PointBuilder`) and sends them straight to
InfluxDB through :class:`bench.direct.DirectWriter`; rows that cannot become
points are dropped. The malformed-lines query goes to Spark's
``noop`` sink: a plain pipeline has nowhere to keep them.

``--stats-sink twophase`` keeps the ``noop`` malformed query but writes the
stats through twophase's own ``foreachBatch`` adapter (as the job does): a
diagnostic that separates the stats sink's cost from the cost of the job's
second (dead-letter) query.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from bench.direct import DirectWriter
from jobs import session_metrics as job
from twophase.config import load_influx_config
from twophase.points import PointBuilder, PointSpec

SPEC = PointSpec(
    measurement=job.MEASUREMENT,
    tag_columns=("stream_id", "isp"),
    time_column="window_end",
    precision="s",
)


def send_partition(spec: PointSpec, batches: Iterable[Any]) -> Iterator[Any]:
    """``mapInArrow`` body: this partition's rows as line protocol, straight to InfluxDB."""
    import pyarrow as pa

    config = load_influx_config()
    writer = DirectWriter(config.url, config.database or "")
    try:
        builder = PointBuilder(spec)
        rows = (row for batch in batches for row in batch.to_pylist())
        lines = [item for item in builder.convert(rows) if isinstance(item, str)]
        writer.write(lines)
    finally:
        writer.close()
    yield pa.RecordBatch.from_pydict({"points": [len(lines)]})


def direct_writer(spec: PointSpec) -> Callable[[Any, int], None]:
    def write(df: Any, batch_id: int) -> None:
        df.mapInArrow(functools.partial(send_partition, spec), "points long").collect()

    return write


def stats_writer(stats: Any, args: Any, sink: str) -> Any:
    if sink == "twophase":
        return job.stats_writer(stats, job.sink_options(args)["stats"], job.FOREACH_BATCH)
    return stats.writeStream.outputMode("update").foreachBatch(direct_writer(SPEC))


def start_queries(spark: Any, args: Any, sink: str) -> dict[str, Any]:
    reader = spark.readStream.format("text")
    if args.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", str(args.max_files_per_trigger))
    lines = job.classified(reader.load(args.input))
    stats = job.session_stats(lines.where("reason IS NULL"), args.window, args.watermark)
    malformed = lines.where("reason IS NOT NULL").select("reason", "payload")
    writers = {
        "stats": stats_writer(stats, args, sink),
        "malformed": malformed.writeStream.format("noop"),
    }
    return job.start_writers(writers, args)


def split_argv(argv: Sequence[str]) -> tuple[str, list[str]]:
    """Our ``--stats-sink`` and the job's own arguments."""
    rest, sink = list(argv), "direct"
    if "--stats-sink" in rest:
        at = rest.index("--stats-sink")
        sink = rest[at + 1]
        del rest[at : at + 2]
    if sink not in ("direct", "twophase"):
        raise SystemExit(f"spark_direct: --stats-sink {sink!r} is not direct or twophase")
    return sink, rest


def main(argv: Sequence[str] | None = None) -> int:
    sink, rest = split_argv(sys.argv[1:] if argv is None else argv)
    args = job.parse_args(rest)
    spark = job.spark_session(args)
    if sink == "twophase":
        import twophase.spark as tps

        tps.register(spark)
    listener = job.progress_listener()
    spark.streams.addListener(listener)
    try:
        return job.wait(spark, start_queries(spark, args, sink), args.available_now)
    finally:
        spark.streams.removeListener(listener)
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
