"""The pipeline a data engineer writes without twophase: the other side of the Spark metric.

::

    python -m bench.spark_plain --input DIR --checkpoint DIR [--max-files-per-trigger N]
        [--available-now] [--master local[2]] [--sink twophase]

Written on purpose without any of twophase's or the job's code, the way the
Spark and InfluxDB documentation suggest: Spark's JSON source with a schema,
lines that do not parse dropped (``DROPMALFORMED``) and events that break the
rules filtered out, 5-minute windows per stream and ISP with a 10-minute
watermark in update mode, and a ``foreachBatch`` whose ``foreachPartition``
formats line protocol with f-strings and POSTs it straight to InfluxDB's 1.x
``/write`` in requests of 5,000 lines (``urllib3``). At-least-once: a failed
or replayed batch is written again; dropped lines are gone.

``--sink twophase`` keeps this pipeline and swaps only its sink for
``twophase.spark.foreach_batch_writer``: the diagnostic that separates the
sink's cost from the job's. The InfluxDB settings come from the
``TWOPHASE_INFLUX_URL`` / ``TWOPHASE_INFLUX_DB`` variables, so both sides
are pointed the same way. Prints ``STARTED``, one ``PROGRESS`` line per
micro-batch and ``DONE``, like the job.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

SCHEMA = (
    "timestamp DOUBLE, stream_id STRING, isp STRING, user_id STRING, "
    "bytes_p2p BIGINT, bytes_cdn BIGINT"
)
BATCH = 5000


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.spark_plain")
    ap.add_argument("--input", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--max-files-per-trigger", type=int, default=None)
    ap.add_argument("--available-now", action="store_true")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--shuffle-partitions", type=int, default=4)
    ap.add_argument("--sink", choices=("direct", "twophase"), default="direct")
    ap.add_argument("--sink-id", default="plain", help="the sink id with --sink twophase")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    return ap.parse_args(argv)


def write_partition(url: str, database: str) -> Callable[[Iterable[Any]], None]:
    """The ``foreachPartition`` body: line protocol by hand, POSTed in batches."""

    def write(rows: Iterable[Any]) -> None:
        import urllib3

        http = urllib3.PoolManager()
        target = f"{url}/write?db={database}&precision=s"
        lines: list[str] = []
        for r in rows:
            lines.append(
                f"stream_stats,isp={r.isp},stream_id={r.stream_id} events={r.events}i,"
                f"users={r.users}i,bytes_p2p={r.bytes_p2p}i,bytes_cdn={r.bytes_cdn}i "
                f"{r.window_end}"
            )
            if len(lines) == BATCH:
                _post(http, target, lines)
                lines = []
        if lines:
            _post(http, target, lines)

    return write


def _post(http: Any, target: str, lines: list[str]) -> None:
    response = http.request("POST", target, body="\n".join(lines).encode())
    if response.status >= 300:
        raise RuntimeError(f"InfluxDB refused a write ({response.status}): {response.data!r}")


def windows(spark: Any, args: argparse.Namespace) -> Any:
    from pyspark.sql import functions as F

    reader = spark.readStream.schema(SCHEMA).option("mode", "DROPMALFORMED")
    if args.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", args.max_files_per_trigger)
    events = reader.json(args.input).where(
        "timestamp IS NOT NULL AND NOT isnan(timestamp) AND timestamp BETWEEN -62135596800"
        " AND 253402300799 AND stream_id <> '' AND isp <> '' AND user_id <> ''"
        " AND bytes_p2p >= 0 AND bytes_cdn >= 0"
    )
    timed = events.withColumn("event_time", F.timestamp_seconds("timestamp"))
    stats = (
        timed.withWatermark("event_time", "10 minutes")
        .groupBy(F.window("event_time", "5 minutes"), "stream_id", "isp")
        .agg(
            F.count(F.lit(1)).alias("events"),
            F.approx_count_distinct("user_id").alias("users"),
            F.sum("bytes_p2p").alias("bytes_p2p"),
            F.sum("bytes_cdn").alias("bytes_cdn"),
        )
    )
    return stats.select(
        "stream_id",
        "isp",
        F.unix_seconds(F.col("window.end")).alias("window_end"),
        "events",
        "users",
        "bytes_p2p",
        "bytes_cdn",
    )


def sink(args: argparse.Namespace) -> Callable[[Any, int], None]:
    if args.sink == "twophase":
        from twophase.spark import foreach_batch_writer

        return foreach_batch_writer(
            args.sink_id,
            measurement="stream_stats",
            tags=["stream_id", "isp"],
            time="window_end",
            precision="s",
        )
    write = write_partition(os.environ["TWOPHASE_INFLUX_URL"], os.environ["TWOPHASE_INFLUX_DB"])

    def each_batch(df: Any, batch_id: int) -> None:
        df.foreachPartition(write)

    return each_batch


def emit(kind: str, **fields: Any) -> None:
    print(f"{kind} {json.dumps(fields, sort_keys=True)}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    started = time.monotonic()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQueryListener

    builder = SparkSession.builder.master(args.master).appName("plain-session-metrics")
    builder = builder.config("spark.sql.shuffle.partitions", str(args.shuffle_partitions))
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    for item in args.conf:
        key, _, value = item.partition("=")
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")

    class Progress(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            p = event.progress
            emit(
                "PROGRESS",
                query="stats",
                batch=p.batchId,
                input_rows=p.numInputRows,
                duration_ms=p.durationMs.get("triggerExecution"),
                commit_ms=p.durationMs.get("addBatch"),
                since_start_s=round(time.monotonic() - started, 3),
            )

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    spark.streams.addListener(Progress())
    writer = windows(spark, args).writeStream.outputMode("update").foreachBatch(sink(args))
    writer = writer.option("checkpointLocation", args.checkpoint).queryName("stats")
    if args.available_now:
        writer = writer.trigger(availableNow=True)
    query = writer.start()
    emit("STARTED", query="stats", id=str(query.id))
    query.awaitTermination()
    emit("DONE", seconds=round(time.monotonic() - started, 3))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
