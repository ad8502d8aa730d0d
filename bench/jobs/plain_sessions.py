"""The seeds' job (``jobs/session_metrics.py``) as a user writes it without twophase:
the same 5-minute windows per stream and ISP, written at-least-once.

::

    python bench/jobs/plain_sessions.py --input DIR --checkpoint DIR

Spark's JSON source with a schema, malformed lines dropped (``DROPMALFORMED``) and
events that break the rules filtered out; the job's aggregation (events, approximate
users, byte sums; 10-minute watermark, update mode), written here again; and a
``foreachBatch`` whose partitions format line protocol with f-strings and POST it to
InfluxDB 1.x ``/write`` (``PLAIN_INFLUX_WRITE_URL``, precision s) in requests of 5,000
lines. The checkpoint of its query is ``<checkpoint>/stats``, as the job's.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

from bench.jobs.common import parse_args, session
from bench.jobs.plain_points import BATCH, post

SCHEMA = (
    "timestamp DOUBLE, stream_id STRING, isp STRING, user_id STRING, "
    "bytes_p2p BIGINT, bytes_cdn BIGINT"
)
VALID = (
    "timestamp IS NOT NULL AND NOT isnan(timestamp) AND timestamp BETWEEN -62135596800"
    " AND 253402300799 AND stream_id <> '' AND isp <> '' AND user_id <> ''"
    " AND bytes_p2p >= 0 AND bytes_cdn >= 0"
)


def windows(spark: Any, max_files: int, source: str) -> Any:
    from pyspark.sql import functions as F

    events = (
        spark.readStream.schema(SCHEMA)
        .option("mode", "DROPMALFORMED")
        .option("maxFilesPerTrigger", max_files)
        .json(source)
        .where(VALID)
        .withColumn("event_time", F.timestamp_seconds("timestamp"))
    )
    stats = (
        events.withWatermark("event_time", "10 minutes")
        .groupBy(F.window("event_time", "5 minutes"), "stream_id", "isp")
        .agg(
            F.count(F.lit(1)).alias("events"),
            F.approx_count_distinct("user_id").alias("users"),
            F.try_sum("bytes_p2p").alias("bytes_p2p"),
            F.try_sum("bytes_cdn").alias("bytes_cdn"),
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
    ).where("bytes_p2p IS NOT NULL AND bytes_cdn IS NOT NULL")  # no integer past 64 bits


def partition(url: str) -> Callable[[Iterable[Any]], None]:
    def write(rows: Iterable[Any]) -> None:
        import urllib3

        http, lines = (
            urllib3.PoolManager(),
            [
                f"stream_stats,isp={r.isp},stream_id={r.stream_id} events={r.events}i,"
                f"users={r.users}i,bytes_p2p={r.bytes_p2p}i,bytes_cdn={r.bytes_cdn}i "
                f"{r.window_end}"
                for r in rows
            ],
        )
        for start in range(0, len(lines), BATCH):
            post(http, url, lines[start : start + BATCH])

    return write


def main() -> int:
    args = parse_args(sys.argv[1:])
    spark = session(args, "plain-sessions")
    write = partition(os.environ["PLAIN_INFLUX_WRITE_URL"])

    def each_batch(df: Any, batch_id: int) -> None:
        df.foreachPartition(write)

    query = (
        windows(spark, args.max_files_per_trigger, args.input)
        .writeStream.outputMode("update")
        .foreachBatch(each_batch)
        .queryName("stats")
        .option("checkpointLocation", os.path.join(args.checkpoint, "stats"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
