"""The freshness metric's pipeline: a steady stream aggregated per second, until told to stop.

::

    python -m bench.freshness_job --input DIR --checkpoint DIR [--master local[2,4]]
        [--trigger-interval "1 second"] [--sink plain|twophase]
        [--promotion inline|background] [--compression gzip|none] [--sink-id ID]

Reads the events files landing in ``--input`` (``bench.spark_plain``'s
reader: JSON with a schema, rule breakers filtered out) with a
processing-time trigger, and aggregates them per 1-second window, stream and
ISP (events, approximate users, byte sums; time = the window's end, in
seconds) with a 1-minute watermark in update mode: the seed job's query with
windows as short as the trigger, so that every micro-batch writes the
windows of the files it read.

Two sinks over the same rows:

* ``--sink plain``: ``bench.spark_plain``'s at-least-once ``foreachBatch``
  (``foreachPartition`` POSTs f-string line protocol to InfluxDB's 1.x
  ``/write``), written without twophase's code;
* ``--sink twophase``: ``twophase.spark.foreach_batch_writer`` with
  ``promotion`` from ``--promotion`` (and ``compression`` only when
  ``--compression`` is given); ``end_query`` after the query.

The query runs until standard input closes; then it stops, a last background
promotion is waited for, and the job prints ``DONE``. InfluxDB and staging
settings come from ``TWOPHASE_*`` variables. Prints ``STARTED`` and one
``PROGRESS`` line per micro-batch, like the other bench jobs.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from bench.spark_plain import (
    end_job,
    parser,
    plain_batch,
    report_progress,
    session,
    windows,
)
from bench.spark_plain import start as start_query

if TYPE_CHECKING:
    from twophase.spark import ForeachBatchWriter

QUERY = "fresh"
MEASUREMENT = "stream_stats"  # what bench.spark_plain's plain writer writes
WINDOW = "1 second"
WATERMARK = "1 minute"  # bounds the state; update mode writes each window when it changes
PLAIN, TWOPHASE = "plain", "twophase"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    ap = parser("python -m bench.freshness_job")
    ap.set_defaults(trigger_interval="1 second")
    ap.add_argument("--sink", choices=(PLAIN, TWOPHASE), default=PLAIN)
    ap.add_argument("--promotion", default="inline", help="twophase's promotion setting")
    ap.add_argument(
        "--compression", default=None, help="twophase's compression setting (passed when given)"
    )
    return ap.parse_args(argv)


def twophase_sink(args: argparse.Namespace) -> ForeachBatchWriter:
    from twophase.spark import foreach_batch_writer

    settings: dict[str, Any] = {"promotion": args.promotion}
    if args.compression is not None:
        settings["compression"] = args.compression
    return foreach_batch_writer(
        args.sink_id,
        measurement=MEASUREMENT,
        tags=["stream_id", "isp"],
        time="window_end",
        precision="s",
        **settings,
    )


def stop_on_eof(query: Any) -> threading.Thread:
    """Stop ``query`` once standard input closes (the bench's way to end a run)."""

    def watch() -> None:
        sys.stdin.read()
        query.stop()

    thread = threading.Thread(target=watch, name="stop-on-eof", daemon=True)
    thread.start()
    return thread


def main(argv: Sequence[str] | None = None) -> int:
    started = time.monotonic()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    writer = twophase_sink(args) if args.sink == TWOPHASE else None  # opens while Spark starts
    spark = session(args, f"freshness-{args.sink}")
    listener = report_progress(spark, started)
    sink: Callable[[Any, int], None] = plain_batch() if writer is None else writer
    stats = windows(spark, args, WINDOW, WATERMARK)
    query = start_query(stats.writeStream.outputMode("update").foreachBatch(sink), QUERY, args)
    stop_on_eof(query)
    return end_job(spark, query, listener, started, writer)


if __name__ == "__main__":
    sys.exit(main())
