"""Metric 9's pipeline: a raw quality-of-service stream, one InfluxDB point per event.

::

    python -m bench.spark_raw_job --input DIR --checkpoint DIR [--max-files-per-trigger N]
        [--available-now] [--master local[2,4]] [--sink plain|twophase]
        [--promotion inline|background] [--promote-connections N] [--compression gzip|none]
        [--sink-id ID]

Reads the generated session events (``jobs/generate_events.py``) with Spark's
JSON source and a schema, keeps the valid ones (``bench.spark_plain``'s
reader), and maps each event to one point: measurement ``qos_raw``, tags
``stream_id``, ``isp`` and ``user_id``, integer fields ``bytes_p2p`` and
``bytes_cdn``, the event's time in milliseconds. No aggregation: every
micro-batch writes as many points as it read events.

Two sinks over the same points:

* ``--sink plain``: the at-least-once ``foreachBatch`` a data engineer
  writes without twophase: ``foreachPartition`` formats line protocol with
  f-strings and POSTs it to InfluxDB's 1.x ``/write`` in requests of 5,000
  lines (urllib3), every partition in parallel.
* ``--sink twophase``: ``twophase.spark.foreach_batch_writer`` with
  ``promotion`` from ``--promotion`` (and ``promote_connections`` or
  ``compression`` only when ``--promote-connections`` or ``--compression``
  is given); ``end_query`` after the query, as users do, which waits for a
  last background promotion.

InfluxDB and staging settings come from ``TWOPHASE_*`` variables, so both
sinks point at the same servers. Prints ``STARTED``, one ``PROGRESS`` line
per micro-batch and ``DONE``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from bench.spark_plain import (
    end_job,
    parser,
    post_lines,
    read_events,
    report_progress,
    session,
)
from bench.spark_plain import start as start_query

if TYPE_CHECKING:
    from twophase.spark import ForeachBatchWriter

QUERY = "raw"
MEASUREMENT = "qos_raw"
TAGS = ("stream_id", "isp", "user_id")
FIELDS = ("bytes_p2p", "bytes_cdn")
TIME = "time_ms"
PLAIN, TWOPHASE = "plain", "twophase"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    ap = parser("python -m bench.spark_raw_job")
    ap.add_argument("--sink", choices=(PLAIN, TWOPHASE), default=PLAIN)
    ap.add_argument("--promotion", default="inline", help="twophase's promotion setting")
    ap.add_argument(
        "--promote-connections",
        type=int,
        default=None,
        metavar="N",
        help="twophase's promote_connections setting (passed only when given)",
    )
    ap.add_argument(
        "--compression",
        default=None,
        help="twophase's compression setting (passed only when given)",
    )
    return ap.parse_args(argv)


def points(spark: Any, args: argparse.Namespace) -> Any:
    """One row per event: the tags, the fields and the event's time in milliseconds."""
    from pyspark.sql import functions as F

    millis = F.round(F.col("timestamp") * 1000).cast("long").alias(TIME)
    return read_events(spark, args).select(*TAGS, *FIELDS, millis)


def write_partition(url: str, database: str) -> Callable[[Iterable[Any]], None]:
    """The plain ``foreachPartition`` body: one line per row, by hand."""

    def write(rows: Iterable[Any]) -> None:
        post_lines(
            f"{url}/write?db={database}&precision=ms",
            (
                f"qos_raw,isp={r.isp},stream_id={r.stream_id},user_id={r.user_id} "
                f"bytes_p2p={r.bytes_p2p}i,bytes_cdn={r.bytes_cdn}i {r.time_ms}"
                for r in rows
            ),
        )

    return write


def plain_sink() -> Callable[[Any, int], None]:
    write = write_partition(os.environ["TWOPHASE_TARGET_URL"], os.environ["TWOPHASE_INFLUX_DB"])

    def each_batch(df: Any, batch_id: int) -> None:
        df.foreachPartition(write)

    return each_batch


def twophase_sink(args: argparse.Namespace) -> ForeachBatchWriter:
    from twophase.spark import foreach_batch_writer

    settings: dict[str, Any] = {"promotion": args.promotion}
    if args.promote_connections is not None:
        settings["promote_connections"] = args.promote_connections
    if args.compression is not None:
        settings["compression"] = args.compression
    return foreach_batch_writer(
        args.sink_id,
        measurement=MEASUREMENT,
        tags=list(TAGS),
        fields=list(FIELDS),
        time=TIME,
        precision="ms",
        **settings,
    )


def main(argv: Sequence[str] | None = None) -> int:
    started = time.monotonic()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    writer = twophase_sink(args) if args.sink == TWOPHASE else None  # opens while Spark starts
    spark = session(args, f"raw-points-{args.sink}")
    listener = report_progress(spark, started)
    sink = plain_sink() if writer is None else writer
    query = start_query(points(spark, args).writeStream.foreachBatch(sink), QUERY, args)
    return end_job(spark, query, listener, started, writer)


if __name__ == "__main__":
    sys.exit(main())
