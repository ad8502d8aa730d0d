"""The pipeline a data engineer writes without twophase: the other side of the Spark metric.

::

    python -m bench.spark_plain --input DIR --checkpoint DIR [--max-files-per-trigger N]
        [--available-now | --trigger-interval "1 second"] [--master local[2,4]] [--sink twophase]

Its reading and its writer are written on purpose without twophase's or the
job's code, the way the Spark and InfluxDB documentation suggest: Spark's JSON
source with a schema, lines that do not parse dropped (``DROPMALFORMED``) and
events that break the rules filtered out; the aggregation is the job's own
(``jobs/session_metrics.py``'s ``session_stats``, imported: both sides compute
the same windows), 5-minute windows per stream and ISP with a 10-minute
watermark in update mode; and a ``foreachBatch`` whose ``foreachPartition``
formats line protocol with f-strings and POSTs it straight to InfluxDB's 1.x
``/write`` in requests of 5,000 lines (``urllib3``). At-least-once: a failed
or replayed batch is written again; dropped lines are gone.

``--sink twophase`` keeps this pipeline and swaps only its sink for
``twophase.spark.foreach_batch_writer``: the diagnostic that separates the
sink's cost from the job's. The InfluxDB settings come from the
``TWOPHASE_TARGET_URL`` / ``TWOPHASE_INFLUX_DB`` variables, so both sides
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


def parser(prog: str) -> argparse.ArgumentParser:
    """The options every bench pipeline takes (input, checkpoint, trigger, Spark)."""
    ap = argparse.ArgumentParser(prog=prog)
    ap.add_argument("--input", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--max-files-per-trigger", type=int, default=None)
    ap.add_argument("--available-now", action="store_true")
    ap.add_argument(
        "--trigger-interval", default=None, help="a processing-time trigger, e.g. '1 second'"
    )
    ap.add_argument("--master", default="local[2,4]")
    ap.add_argument("--shuffle-partitions", type=int, default=4)
    ap.add_argument("--sink-id", default="plain", help="the sink id with --sink twophase")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    return ap


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    ap = parser("python -m bench.spark_plain")
    ap.add_argument("--sink", choices=("direct", "twophase"), default="direct")
    return ap.parse_args(argv)


def write_partition(url: str, database: str) -> Callable[[Iterable[Any]], None]:
    """The ``foreachPartition`` body: line protocol by hand, POSTed in batches."""

    def write(rows: Iterable[Any]) -> None:
        post_lines(
            f"{url}/write?db={database}&precision=s",
            (
                f"stream_stats,isp={r.isp},stream_id={r.stream_id} events={r.events}i,"
                f"users={r.users}i,bytes_p2p={r.bytes_p2p}i,bytes_cdn={r.bytes_cdn}i "
                f"{r.window_end}"
                for r in rows
            ),
        )

    return write


def post_lines(target: str, lines: Iterable[str]) -> None:
    """POST ``lines`` to the ``/write`` URL ``target`` in requests of ``BATCH`` lines."""
    import urllib3

    http = urllib3.PoolManager()
    batch: list[str] = []
    for line in lines:
        batch.append(line)
        if len(batch) == BATCH:
            _post(http, target, batch)
            batch = []
    if batch:
        _post(http, target, batch)


def _post(http: Any, target: str, lines: list[str]) -> None:
    response = http.request("POST", target, body="\n".join(lines).encode())
    if response.status >= 300:
        raise RuntimeError(f"InfluxDB refused a write ({response.status}): {response.data!r}")


def read_events(spark: Any, args: argparse.Namespace) -> Any:
    """The events of ``--input`` (JSON with a schema), malformed lines and rule breakers
    dropped, ``--max-files-per-trigger`` files per micro-batch."""
    reader = spark.readStream.schema(SCHEMA).option("mode", "DROPMALFORMED")
    if args.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", args.max_files_per_trigger)
    return reader.json(args.input).where(
        "timestamp IS NOT NULL AND NOT isnan(timestamp) AND timestamp BETWEEN -62135596800"
        " AND 253402300799 AND stream_id <> '' AND isp <> '' AND user_id <> ''"
        " AND bytes_p2p >= 0 AND bytes_cdn >= 0"
    )


def windows(
    spark: Any, args: argparse.Namespace, width: str = "5 minutes", watermark: str = "10 minutes"
) -> Any:
    """Per window of ``width``, stream and ISP: the job's aggregation
    (``jobs/session_metrics.py``'s ``session_stats``: events, approximate users, byte
    sums; time = the window's end in seconds), so both sides compute the same windows."""
    from jobs.session_metrics import session_stats  # the repository root is on sys.path

    stats = session_stats(read_events(spark, args), width, watermark)
    # a sum past 64 bits is null (the job dead-letters the window); this writer has no
    # dead letters and InfluxDB no integer for it: the window is not written
    return stats.where("bytes_p2p IS NOT NULL AND bytes_cdn IS NOT NULL")


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
    return plain_batch()


def plain_batch() -> Callable[[Any, int], None]:
    """The plain ``foreachBatch`` function: every partition POSTs its windows itself."""
    write = write_partition(os.environ["TWOPHASE_TARGET_URL"], os.environ["TWOPHASE_INFLUX_DB"])

    def each_batch(df: Any, batch_id: int) -> None:
        df.foreachPartition(write)

    return each_batch


def emit(kind: str, **fields: Any) -> None:
    print(f"{kind} {json.dumps(fields, sort_keys=True)}", flush=True)


def session(args: argparse.Namespace, app: str) -> Any:
    """The Spark session of ``args`` (master, shuffle partitions, ``--conf``), UTC."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(args.master).appName(app)
    builder = builder.config("spark.sql.shuffle.partitions", str(args.shuffle_partitions))
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    for item in args.conf:
        key, _, value = item.partition("=")
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def report_progress(spark: Any, started: float) -> Any:
    """One ``PROGRESS`` line per micro-batch of every query of ``spark``; the listener
    (its ``reported`` holds the batch ids printed)."""
    from pyspark.sql.streaming.listener import StreamingQueryListener

    class Progress(StreamingQueryListener):
        def __init__(self) -> None:
            super().__init__()
            self.reported: set[int] = set()

        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            p = event.progress
            emit(
                "PROGRESS",
                query=p.name,
                batch=p.batchId,
                input_rows=p.numInputRows,
                duration_ms=p.durationMs.get("triggerExecution"),
                commit_ms=p.durationMs.get("addBatch"),
                since_start_s=round(time.monotonic() - started, 3),
            )
            self.reported.add(p.batchId)

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    listener = Progress()
    spark.streams.addListener(listener)
    return listener


def await_reported(query: Any, listener: Any, timeout_s: float = 30.0) -> None:
    """Wait until ``listener`` printed the query's last progress: listener events arrive
    asynchronously, and a process that stops Spark at once loses the last ones."""
    last = query.lastProgress
    deadline = time.monotonic() + timeout_s
    while last is not None and last.batchId not in listener.reported:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no progress event for batch {last.batchId} in {timeout_s} s")
        time.sleep(0.01)


def end_job(
    spark: Any,
    query: Any,
    listener: Any,
    started: float,
    writer: Any = None,
    records: Callable[[], None] | None = None,
) -> int:
    """Every bench job's ending: the query run out (raises if it failed); with a twophase
    ``writer``, the last background promotion drained and the run's end recorded, as
    users do; the last progress printed; ``records()`` (the job's other records); then
    ``DONE`` and Spark stopped. Exit status 0."""
    try:
        query.awaitTermination()  # returns once stopped; raises if the query failed
        if writer is not None:  # with background promotion, the last epoch may be on its way
            from twophase.spark import drain_query

            drain_query(writer)
    finally:
        if writer is not None:  # the run's end, recorded as users do
            from twophase.spark import end_query

            end_query(query, writer)
    await_reported(query, listener)
    if records is not None:
        records()
    emit("DONE", seconds=round(time.monotonic() - started, 3))
    spark.stop()
    return 0


def start(writer: Any, name: str, args: argparse.Namespace) -> Any:
    """Start ``writer`` as query ``name`` with the checkpoint and trigger of ``args``."""
    writer = writer.option("checkpointLocation", args.checkpoint).queryName(name)
    if args.available_now:
        writer = writer.trigger(availableNow=True)
    elif args.trigger_interval:
        writer = writer.trigger(processingTime=args.trigger_interval)
    query = writer.start()
    emit("STARTED", query=name, id=str(query.id))
    return query


def main(argv: Sequence[str] | None = None) -> int:
    started = time.monotonic()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = session(args, "plain-session-metrics")
    listener = report_progress(spark, started)
    query = start(
        windows(spark, args).writeStream.outputMode("update").foreachBatch(sink(args)),
        "stats",
        args,
    )
    return end_job(spark, query, listener, started)


if __name__ == "__main__":
    sys.exit(main())
