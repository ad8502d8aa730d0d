"""Five-minute aggregates of video-session events into InfluxDB, exactly once.

::

    spark-submit jobs/session_metrics.py --input DIR --checkpoint DIR --sink-id NAME \
        [--available-now | --trigger-interval 10s] [--max-files-per-trigger N] \
        [--window "5 minutes"] [--watermark "10 minutes"]

    python jobs/session_metrics.py ...        # the same, Spark started from this Python

Reads JSON-lines events (``{"timestamp": 1545184226.432, "stream_id": "s1",
"isp": "acme", "user_id": "u42", "bytes_p2p": 1200, "bytes_cdn": 800}``)
from ``--input`` with Spark's file source, aggregates event-time tumbling
windows per ``stream_id`` and ``isp`` with a watermark in update mode, and
writes measurement ``stream_stats`` (tags ``stream_id``, ``isp``; integer
fields ``events``, ``users`` (approximate distinct ``user_id``),
``bytes_p2p``, ``bytes_cdn``; time = window end, in seconds) exactly once
under sink ``--sink-id``. PySpark's Python data sources cannot run in update
mode, so the stats go through ``twophase.spark.foreach_batch_writer`` (the
same protocol); ``--stats-writer data-source`` uses the ``twophase-influx``
format in complete mode instead.

Malformed lines neither stop the job nor vanish: a second query writes each
one, with its reason, to the dead-letter table under sink
``<sink-id>.malformed`` (count them with ``twophase status`` or SQL),
through ``foreach_batch_writer(mode="dead_letters")``; ``--malformed-writer
data-source`` uses the ``twophase-influx`` format in ``dead_letters`` mode
instead (measured: the whole job ran at 0.80-0.82 of a direct-write job
that way, 0.91 through foreachBatch; ``bench/README.md``).

Two queries, two checkpoints: ``<checkpoint>/stats`` and
``<checkpoint>/malformed``. The staging database and InfluxDB come from the
``TWOPHASE_*`` environment variables. Standard output carries one line per
event for scripts: ``STARTED``, ``PROGRESS`` (JSON), ``DONE``.

Exit status: 0 when ``--available-now`` consumed the input, 1 when a query
failed, 2 when the job was refused at start (bad setting, sink owned by
another query).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

MEASUREMENT = "stream_stats"
MALFORMED_SUFFIX = ".malformed"
EVENT_SCHEMA = (
    "timestamp double, stream_id string, isp string, user_id string, "
    "bytes_p2p bigint, bytes_cdn bigint"
)
# Event times Spark can hold as a timestamp (years 1 to 9999), in epoch seconds.
MIN_EVENT_SECONDS = -62135596800
MAX_EVENT_SECONDS = 253402300799
DEFAULT_SHUFFLE_PARTITIONS = 4
FORMAT = "twophase-influx"
FOREACH_BATCH, DATA_SOURCE = "foreach-batch", "data-source"
EXIT_FAILED, EXIT_REFUSED = 1, 2


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="session_metrics", description=__doc__.split("\n")[0])
    ap.add_argument("--input", required=True, help="directory of JSON-lines event files")
    ap.add_argument("--checkpoint", required=True, help="checkpoint directory (one per job)")
    ap.add_argument("--sink-id", required=True, help="stable sink id (one per query)")
    trigger = ap.add_mutually_exclusive_group()
    trigger.add_argument(
        "--available-now", action="store_true", help="process what is in --input now, then stop"
    )
    trigger.add_argument(
        "--trigger-interval",
        default="10 seconds",
        help="micro-batch interval when running continuously (default 10s)",
    )
    ap.add_argument("--max-files-per-trigger", type=int, default=None)
    ap.add_argument("--window", default="5 minutes")
    ap.add_argument("--watermark", default="10 minutes")
    ap.add_argument(
        "--shuffle-partitions",
        type=int,
        default=DEFAULT_SHUFFLE_PARTITIONS,
        help="spark.sql.shuffle.partitions (default 4: about 1 s per micro-batch "
        "of a few thousand events locally; raise it on a cluster)",
    )
    ap.add_argument(
        "--stats-writer",
        choices=(FOREACH_BATCH, DATA_SOURCE),
        default=FOREACH_BATCH,
        help="foreach-batch: update mode (default); data-source: the "
        "twophase-influx format in complete mode (Python data sources cannot "
        "do update mode)",
    )
    ap.add_argument(
        "--malformed-writer",
        choices=(FOREACH_BATCH, DATA_SOURCE),
        default=FOREACH_BATCH,
        help="how malformed lines reach the dead-letter table: foreach-batch "
        "(default) or the twophase-influx format in dead_letters mode",
    )
    ap.add_argument(
        "--master",
        default=None,
        help="Spark master when started with python (spark-submit: use its --master)",
    )
    ap.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark configuration (repeatable)",
    )
    ap.add_argument(
        "--no-ship-package",
        action="store_true",
        help="do not add a zip of twophase to the executors (it is installed there)",
    )
    return ap.parse_args(argv)


def spark_session(args: argparse.Namespace) -> Any:
    """A session with small shuffles and UTC; Python workers use this Python."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(f"twophase-session-metrics-{args.sink_id}")
    if args.master:
        builder = builder.master(args.master)
    builder = builder.config("spark.sql.shuffle.partitions", str(args.shuffle_partitions))
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"session_metrics: --conf {item!r} is not KEY=VALUE")
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def classified(lines: Any) -> Any:
    """Raw lines -> columns ``payload``, ``reason`` (null when valid) and the event fields."""
    from pyspark.sql import functions as F

    event = F.col("e")
    ts = event["timestamp"]
    names = ("stream_id", "isp", "user_id")
    no_fields = ts.isNull()
    for name in (*names, "bytes_p2p", "bytes_cdn"):
        no_fields = no_fields & event[name].isNull()
    reason = F.when(no_fields, F.lit("not a JSON object with event fields"))
    reason = reason.when(ts.isNull(), "timestamp missing or not a number")
    reason = reason.when(
        F.isnan(ts) | (ts < MIN_EVENT_SECONDS) | (ts > MAX_EVENT_SECONDS),
        "timestamp is not a number of seconds within years 1..9999",
    )
    for name in names:
        reason = reason.when(event[name].isNull() | (event[name] == ""), f"{name} missing or empty")
    for name in ("bytes_p2p", "bytes_cdn"):
        reason = reason.when(event[name].isNull(), f"{name} missing or not an integer")
        reason = reason.when(event[name] < 0, f"{name} is negative")
    return lines.select(
        F.col("value").alias("payload"), F.from_json("value", EVENT_SCHEMA).alias("e")
    ).select("payload", reason.alias("reason"), "e.*")


def session_stats(events: Any, window: str, watermark: str) -> Any:
    """Per window, stream and ISP: events, approximate users, byte sums; time = window end."""
    from pyspark.sql import functions as F

    timed = events.withColumn("event_time", F.timestamp_seconds("timestamp"))
    grouped = timed.withWatermark("event_time", watermark).groupBy(
        F.window("event_time", window), "stream_id", "isp"
    )
    stats = grouped.agg(
        F.count(F.lit(1)).alias("events"),
        F.approx_count_distinct("user_id").alias("users"),
        # try_sum: an overflow becomes a null field (dead-lettered), not a failed query
        F.try_sum("bytes_p2p").alias("bytes_p2p"),
        F.try_sum("bytes_cdn").alias("bytes_cdn"),
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


def sink_options(args: argparse.Namespace) -> dict[str, dict[str, str]]:
    """The twophase-influx options of both queries (settings come from TWOPHASE_*)."""
    return {
        "stats": {
            "sink_id": args.sink_id,
            "measurement": MEASUREMENT,
            "tags": "stream_id,isp",
            "time": "window_end",
            "precision": "s",
        },
        "malformed": {"sink_id": args.sink_id + MALFORMED_SUFFIX, "mode": "dead_letters"},
    }


def start_queries(spark: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Start the stats query and the malformed-lines query (append, data source sink)."""
    reader = spark.readStream.format("text")
    if args.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", str(args.max_files_per_trigger))
    lines = classified(reader.load(args.input))
    options = sink_options(args)
    stats = session_stats(lines.where("reason IS NULL"), args.window, args.watermark)
    malformed = lines.where("reason IS NOT NULL").select("reason", "payload")
    writers = {
        "stats": stats_writer(stats, options["stats"], args.stats_writer),
        "malformed": malformed_writer(malformed, options["malformed"], args.malformed_writer),
    }
    return start_writers(writers, args)


def start_writers(writers: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Start each named stream writer with its own checkpoint and the job's trigger."""
    queries = {}
    for name, writer in writers.items():
        writer = writer.queryName(name).option(
            "checkpointLocation", os.path.join(args.checkpoint, name)
        )
        if args.available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=args.trigger_interval)
        queries[name] = writer.start()
        emit("STARTED", query=name, id=str(queries[name].id), run_id=str(queries[name].runId))
    return queries


def stats_writer(stats: Any, options: dict[str, str], how: str) -> Any:
    """Update mode through the foreachBatch adapter, or complete mode through the data source.

    PySpark's Python data sources accept only append and complete output
    modes (Spark refuses update mode for them), so the dashboard's update
    mode goes through :func:`twophase.spark.foreach_batch_writer`: the same
    protocol, driven from foreachBatch. ``data-source`` re-sends every window
    of the state each micro-batch (complete mode keeps all state): fine for
    demos and tests, not for a query that runs for weeks.
    """
    from twophase.spark import foreach_batch_writer

    if how == DATA_SOURCE:
        return stats.writeStream.format(FORMAT).outputMode("complete").options(**options)
    write = foreach_batch_writer(
        options["sink_id"],
        measurement=options["measurement"],
        tags=options["tags"].split(","),
        time=options["time"],
        precision=options["precision"],
    )
    return stats.writeStream.outputMode("update").foreachBatch(write)


def malformed_writer(malformed: Any, options: dict[str, str], how: str) -> Any:
    """Malformed lines into the dead-letter table, through foreachBatch or the data source."""
    from twophase.spark import foreach_batch_writer

    if how == DATA_SOURCE:
        return malformed.writeStream.format(FORMAT).options(**options)
    write = foreach_batch_writer(options["sink_id"], mode=options["mode"])
    return malformed.writeStream.foreachBatch(write)


def emit(kind: str, **fields: Any) -> None:
    """One machine-readable line on standard output."""
    print(f"{kind} {json.dumps(fields, sort_keys=True)}", flush=True)


def progress_listener() -> Any:
    """A listener printing one PROGRESS line per micro-batch."""
    from pyspark.sql.streaming import StreamingQueryListener

    class Progress(StreamingQueryListener):
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
            )

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    return Progress()


_TWOPHASE_ERROR = re.compile(r"twophase\.errors\.(\w+): (.+)")


def explain(error: BaseException) -> str:
    """The twophase error inside a Spark exception, else its first line."""
    text = str(error)
    found = _TWOPHASE_ERROR.findall(text)
    if found:
        name, message = found[-1]
        return f"{name}: {message.strip()}"
    return text.strip().splitlines()[0] if text.strip() else type(error).__name__


def fail(queries: dict[str, Any], code: int, message: str) -> int:
    for query in queries.values():
        with contextlib.suppress(Exception):  # already failed or stopped
            query.stop()
    print(f"session_metrics: error: {message}", file=sys.stderr, flush=True)
    return code


def run(args: argparse.Namespace) -> int:
    spark = spark_session(args)
    import twophase.spark as tps

    if not args.no_ship_package:
        tps.ship_package(spark)
    tps.register(spark)
    listener = progress_listener()
    spark.streams.addListener(listener)
    try:
        return start_and_wait(spark, args)
    finally:
        spark.streams.removeListener(listener)
        spark.stop()


def start_and_wait(spark: Any, args: argparse.Namespace) -> int:
    """Start both queries, claim their sinks, and wait; the exit status."""
    import twophase.spark as tps
    from twophase.errors import TwoPhaseError

    queries: dict[str, Any] = {}
    try:
        queries = start_queries(spark, args)
        options = sink_options(args)
        for name, query in queries.items():
            tps.claim_query(query, options[name])
    except TwoPhaseError as exc:
        return fail(queries, EXIT_REFUSED, f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # Spark's analysis errors carry the sink's ConfigError
        return fail(queries, EXIT_REFUSED, explain(exc))
    return wait(spark, queries, args.available_now)


def wait(spark: Any, queries: dict[str, Any], available_now: bool) -> int:
    """Until every query finished (available-now) or one failed (then stop the others)."""
    try:
        if available_now:
            for query in queries.values():
                query.awaitTermination()
        else:
            spark.streams.awaitAnyTermination()
    except Exception as exc:
        return fail(queries, EXIT_FAILED, explain(exc))
    failed = [q for q in queries.values() if q.exception() is not None]
    if failed:
        return fail(queries, EXIT_FAILED, explain(failed[0].exception()))
    if not available_now:
        return fail(queries, EXIT_FAILED, "a query stopped unexpectedly")
    emit("DONE")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
