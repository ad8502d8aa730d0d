"""Five-minute aggregates of video-session events into the sink's targets, exactly once.

::

    spark-submit jobs/session_metrics.py --input DIR --checkpoint DIR --sink-id NAME \
        [--available-now | --trigger-interval 10s] [--max-files-per-trigger N] \
        [--window "5 minutes"] [--watermark "10 minutes"] [--log-format text|json] \
        [--measurement-per-metric]

    python jobs/session_metrics.py ...        # the same, Spark started from this Python
                                              # (master local[*,4] unless --master)
    python jobs/session_metrics.py --remote sc://HOST:15002 ...   # a Spark Connect client

Reads JSON-lines events (``{"timestamp": 1545184226.432, "stream_id": "s1",
"isp": "acme", "user_id": "u42", "bytes_p2p": 1200, "bytes_cdn": 800}``)
from ``--input`` with Spark's file source, aggregates event-time tumbling
windows per ``stream_id`` and ``isp`` with a watermark in update mode, and
writes measurement ``stream_stats`` (tags ``stream_id``, ``isp``; integer
fields ``events``, ``users`` (approximate distinct ``user_id``),
``bytes_p2p``, ``bytes_cdn``; time = window end, in seconds) exactly once
under sink ``--sink-id``. With ``--measurement-per-metric`` each aggregate is a
measurement of its own instead, ``stream_stats_events``, ``stream_stats_users``,
``stream_stats_bytes_p2p`` and ``stream_stats_bytes_cdn`` (same tags and time, one
integer field ``value``), all from the same DataFrame through the sink's
``measurement_column``: each window's row becomes one row per metric, whose
``metric`` column names its measurement (an overflowed sum then dead-letters that
metric's row alone). PySpark's Python data sources cannot run in update mode, so the
stats go through ``twophase.spark.foreach_batch_writer`` (the same protocol);
``--stats-writer data-source`` uses the ``twophase`` format in complete mode
instead.

One query reads and parses each line once, with Spark's JSON source and a
schema. Malformed lines neither stop the job nor vanish: each line is
classified in a projection (``reason``, null for a good event), and
``twophase.spark.split_dead_letters`` stages the bad ones, with their
reason, in the tasks that read them, under sink
``<sink-id>.malformed``; the writer decides them with the stats' epoch, so
each reaches the dead-letter table exactly once (count them with
``twophase status`` or ``twophase dead-letters``). The good ones go on to
the aggregation.

Checkpoint: ``<checkpoint>/stats``. The staging database and the targets (InfluxDB,
PostgreSQL...) come from the ``TWOPHASE_*`` environment variables. Standard output
carries one line per event for scripts: ``STARTED``, ``PROGRESS`` (JSON), ``DONE``.
twophase's INFO lines (commits, replays detected, recoveries), each naming its
``sink_id``, ``epoch`` and ``run_id``, go to standard error as text or, with
``--log-format json``, as one JSON object per line (:mod:`twophase.logs`); spark-submit
merges its Python driver's standard error into its standard output. Spark's own
logging is left to its log4j settings.

Exit status: 0 when ``--available-now`` consumed the input, 1 when a query
failed (also when, at the start, a server was away while the job delivered
what a crashed run had left), 2 when the job was refused at start (bad
setting, sink owned by another query).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import threading
from collections.abc import Sequence
from typing import Any

from twophase import logs
from twophase.errors import ConfigError

MEASUREMENT = "stream_stats"
# --measurement-per-metric: the column naming each row's measurement, the metrics
# (each written as measurement stream_stats_<metric>) and their one field.
METRIC_COLUMN = "metric"
METRICS = ("events", "users", "bytes_p2p", "bytes_cdn")
VALUE_FIELD = "value"
MALFORMED_SUFFIX = ".malformed"
CORRUPT = "_corrupt_record"
BYTES = ("bytes_p2p", "bytes_cdn")
EVENT_SCHEMA = (
    "timestamp double, stream_id string, isp string, user_id string, "
    "bytes_p2p bigint, bytes_cdn bigint"
)
# Event times Spark can hold as a timestamp (years 1 to 9999), in epoch seconds.
MIN_EVENT_SECONDS = -62135596800
MAX_EVENT_SECONDS = 253402300799
DEFAULT_SHUFFLE_PARTITIONS = 4
# All cores, and up to 4 attempts per task: local[*] runs each task once, so a task
# whose staging a dropped PostgreSQL connection cut would fail the query.
DEFAULT_MASTER = "local[*,4]"
FORMAT = "twophase"
# How often the job reads its query's progress: a PROGRESS line comes this long after
# its micro-batch at most.
PROGRESS_POLL_S = 0.2
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
        "twophase format in complete mode (Python data sources cannot "
        "do update mode)",
    )
    where = ap.add_mutually_exclusive_group()
    where.add_argument(
        "--master",
        default=None,
        help=f"Spark master when started with python (default {DEFAULT_MASTER}: all cores, "
        "a failed task tried up to 4 times; spark-submit: use its --master)",
    )
    where.add_argument(
        "--remote",
        default=None,
        metavar="sc://HOST:PORT",
        help="run as a Spark Connect client of this server (the server is the driver: "
        "give it the TWOPHASE_* settings and a Python with twophase installed)",
    )
    ap.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark configuration (repeatable)",
    )
    ap.add_argument(
        "--ship-package",
        action="store_true",
        help="add a zip of twophase to the executors' path (when it is not installed there)",
    )
    ap.add_argument(
        "--targets",
        default=None,
        metavar="NAME=URL,...",
        help="deliver to several targets, each exactly once (the sinks' option "
        "targets; default: TWOPHASE_TARGETS, else TWOPHASE_TARGET_URL's one server)",
    )
    ap.add_argument(
        "--measurement-per-metric",
        action="store_true",
        help=f"write each aggregate as a measurement of its own ({MEASUREMENT}_events, "
        f"{MEASUREMENT}_users, ...; field {VALUE_FIELD}) from one DataFrame, through the "
        f"sink's measurement_column (default: one measurement, {MEASUREMENT})",
    )
    ap.add_argument(
        "--log-format",
        choices=logs.FORMATS,
        default=logs.TEXT,
        help="twophase's log lines on stderr: text (default), or one JSON object per line "
        "(needs twophase[json-logs])",
    )
    return ap.parse_args(argv)


def spark_session(args: argparse.Namespace) -> Any:
    """A session with small shuffles and UTC; Python workers use this Python."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(f"twophase-session-metrics-{args.sink_id}")
    master = args.master or (None if args.remote or _under_spark_submit() else DEFAULT_MASTER)
    if master:
        builder = builder.master(master)
    if args.remote:
        builder = builder.remote(args.remote)
    builder = builder.config("spark.sql.shuffle.partitions", str(args.shuffle_partitions))
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"session_metrics: --conf {item!r} is not KEY=VALUE")
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if not args.remote:  # a Connect client has no SparkContext: the server logs
        spark.sparkContext.setLogLevel("WARN")
    return spark


def _under_spark_submit() -> bool:
    """spark-submit started this Python (its JVM gateway is already up): its --master
    applies, which a master set here would override."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def read_events(spark: Any, args: argparse.Namespace) -> Any:
    """The input through Spark's JSON source: one parse per line, the line kept when it
    does not parse (PERMISSIVE mode, with partial results for the fields that did)."""
    reader = (
        spark.readStream.schema(f"{EVENT_SCHEMA}, {CORRUPT} STRING")
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT)
    )
    if args.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", str(args.max_files_per_trigger))
    return reader.json(args.input)


def classified(raw: Any) -> Any:
    """Parsed lines -> ``payload``, ``reason`` (null when valid) and the event fields.

    The payload is the line itself when it does not parse as an event, and the
    parsed event as JSON when it parses but breaks a rule (Spark's JSON source
    keeps no line it could read).
    """
    from pyspark.sql import functions as F

    ts = F.col("timestamp")
    names = ("stream_id", "isp", "user_id")
    no_fields = ts.isNull()
    for name in (*names, *BYTES):
        no_fields = no_fields & F.col(name).isNull()
    reason = F.when(no_fields, F.lit("not a JSON object with event fields"))
    reason = reason.when(ts.isNull(), "timestamp missing or not a number")
    reason = reason.when(
        F.isnan(ts) | (ts < MIN_EVENT_SECONDS) | (ts > MAX_EVENT_SECONDS),
        "timestamp is not a number of seconds within years 1..9999",
    )
    for name in names:
        reason = reason.when(F.col(name).isNull() | (F.col(name) == ""), f"{name} missing or empty")
    for name in BYTES:
        reason = reason.when(F.col(name).isNull(), f"{name} missing or not an integer")
        reason = reason.when(F.col(name) < 0, f"{name} is negative")
    reason = reason.when(F.col(CORRUPT).isNotNull(), "not valid JSON")
    fields = ["timestamp", *names, *BYTES]
    # A projection, not a filter: the rows are split later, in Python, so nothing is
    # pushed below the parse. Only bad rows carry a payload across to Python.
    judged = raw.select("*", reason.alias("reason"))
    line = F.coalesce(F.col(CORRUPT), F.to_json(F.struct(*fields)))
    payload = F.when(F.col("reason").isNotNull(), line).alias("payload")
    return judged.select(payload, "reason", *fields)


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


def per_metric(stats: Any) -> Any:
    """``--measurement-per-metric``: each row of ``session_stats`` as one row per metric,
    its ``metric`` column the measurement's name and its value in ``value``."""
    from pyspark.sql import functions as F

    pairs = ", ".join(f"'{MEASUREMENT}_{name}', {name}" for name in METRICS)
    stacked = F.expr(f"stack({len(METRICS)}, {pairs}) AS ({METRIC_COLUMN}, {VALUE_FIELD})")
    return stats.select("stream_id", "isp", "window_end", stacked)


def sink_options(args: argparse.Namespace) -> dict[str, str]:
    """The twophase options of the stats sink (settings come from TWOPHASE_*,
    the targets from ``--targets`` when given)."""
    measurement = (
        {"measurement_column": METRIC_COLUMN}
        if args.measurement_per_metric
        else {"measurement": MEASUREMENT}
    )
    options = {
        "sink_id": args.sink_id,
        **measurement,
        "tags": "stream_id,isp",
        "time": "window_end",
        "precision": "s",
        "dead_letter_sink": args.sink_id + MALFORMED_SUFFIX,
    }
    return options | ({"targets": args.targets} if args.targets else {})


def start_query(spark: Any, args: argparse.Namespace) -> tuple[Any, Any]:
    """Start the one query: parse once, split the malformed lines off, aggregate, write.
    The query, and what names its sink to claim_query and end_query."""
    lines = classified(read_events(spark, args))
    options = sink_options(args)
    if args.stats_writer == DATA_SOURCE:
        import twophase.spark as tps

        events = tps.split_dead_letters(lines, options)
        stats = output(session_stats(events, args.window, args.watermark), args)
        # The sink's commit runs in a Python worker of its own: it sets up its logging there.
        options |= {"log_format": args.log_format}
        writer = stats.writeStream.format(FORMAT).outputMode("complete").options(**options)
        return start_writer(writer, "stats", args), options
    write = foreach_batch(options)
    events = write.split_dead_letters(lines)
    stats = output(session_stats(events, args.window, args.watermark), args)
    writer = stats.writeStream.outputMode("update").foreachBatch(write)
    # Under Spark Connect the writer's batches run under its own run id: it names the sink.
    return start_writer(writer, "stats", args), write


def output(stats: Any, args: argparse.Namespace) -> Any:
    """What the sink writes: the stats as they are, or a row per metric."""
    return per_metric(stats) if args.measurement_per_metric else stats


def start_writer(writer: Any, name: str, args: argparse.Namespace) -> Any:
    """Start a stream writer with its checkpoint under ``--checkpoint`` and the job's trigger."""
    writer = writer.queryName(name).option(
        "checkpointLocation", os.path.join(args.checkpoint, name)
    )
    if args.available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=args.trigger_interval)
    query = writer.start()
    emit("STARTED", query=name, id=str(query.id), run_id=str(query.runId))
    return query


def foreach_batch(options: dict[str, str]) -> Any:
    """Update mode through the foreachBatch adapter.

    PySpark's Python data sources accept only append and complete output
    modes (Spark refuses update mode for them), so the dashboard's update
    mode goes through :func:`twophase.spark.foreach_batch_writer`: the same
    protocol, driven from foreachBatch. ``--stats-writer data-source``
    re-sends every window of the state each micro-batch (complete mode keeps
    all state): fine for demos and tests, not for a query that runs for weeks.
    """
    from twophase.spark import foreach_batch_writer

    return foreach_batch_writer(
        options["sink_id"],
        measurement=options.get("measurement"),
        measurement_column=options.get("measurement_column"),
        tags=options["tags"].split(","),
        time=options["time"],
        precision=options["precision"],
        dead_letter_sink=options["dead_letter_sink"],
    )


def emit(kind: str, **fields: Any) -> None:
    """One machine-readable line on standard output."""
    print(f"{kind} {json.dumps(fields, sort_keys=True)}", flush=True)


def await_reporting(query: Any) -> None:
    """``query.awaitTermination()``, printing a PROGRESS line for each micro-batch's
    progress as it comes. Read from the query (``lastProgress``, then
    ``recentProgress`` when it changed), not by a listener: PySpark turns each
    listener event into Python objects a field at a time over Py4J, which cost more
    of the driver's CPU than the job's own micro-batches."""
    printed = None
    while not query.awaitTermination(PROGRESS_POLL_S):
        printed = report_progress(query, printed)
    report_progress(query, printed)


def report_progress(query: Any, after: tuple[str, int] | None) -> tuple[str, int] | None:
    """Print the query's progress updates later than ``after`` (their time and batch);
    the last one printed. ``recentProgress`` is in the order the updates came."""
    newest = query.lastProgress
    if newest is None or _progress_key(newest) == after:
        return after
    for p in query.recentProgress:
        if after is not None and _progress_key(p) <= after:
            continue
        after = _progress_key(p)
        emit(
            "PROGRESS",
            query=p["name"],
            batch=p["batchId"],
            input_rows=p["numInputRows"],
            duration_ms=p["durationMs"].get("triggerExecution"),
            commit_ms=p["durationMs"].get("addBatch"),
        )
    return after


def _progress_key(progress: Any) -> tuple[str, int]:
    """When the update came (its trigger's ISO time, which sorts as text) and its batch."""
    return progress["timestamp"], progress["batchId"]


_TWOPHASE_ERROR = re.compile(r"twophase\.errors\.(\w+): (.+)")


def explain(error: BaseException) -> str:
    """The twophase error inside a Spark exception, else its first line."""
    text = str(error)
    found = _TWOPHASE_ERROR.findall(text)
    if found:
        name, message = found[-1]
        return f"{name}: {message.strip()}"
    return text.strip().splitlines()[0] if text.strip() else type(error).__name__


def fail(query: Any, code: int, message: str) -> int:
    if query is not None:
        with contextlib.suppress(Exception):  # already failed or stopped
            query.stop()
    print(f"session_metrics: error: {message}", file=sys.stderr, flush=True)
    return code


def run(args: argparse.Namespace) -> int:
    spark = spark_session(args)
    threading.Thread(target=prepare, args=(args,), name="twophase-prepare", daemon=True).start()
    import twophase.spark as tps

    if args.ship_package:
        tps.ship_package(spark)
    if args.stats_writer == DATA_SOURCE:
        tps.register(spark)
    try:
        return start_and_wait(spark, args)
    finally:
        spark.stop()


def prepare(args: argparse.Namespace) -> None:
    """Import twophase and open the sink's parts while the query is built and planned:
    the first micro-batch finds the staging store connected. Not while the session
    starts: its own imports in the driver's Python are then on the way to the first
    micro-batch, and a thread importing beside them holds them back."""
    with contextlib.suppress(Exception):  # the query's own use reports any problem
        from twophase.spark.driver_commit import open_in_background
        from twophase.spark.options import parse_options

        open_in_background(parse_options(sink_options(args)))


def start_and_wait(spark: Any, args: argparse.Namespace) -> int:
    """Start the query, claim its sinks (delivering what a crashed run left), and wait;
    the exit status."""
    import twophase.spark as tps
    from twophase.errors import RetryableError, TwoPhaseError

    query = sink = None
    try:
        query, sink = start_query(spark, args)
        tps.claim_query(query, sink)
    except RetryableError as exc:  # the claim's recovery met a server away: try again later
        code = fail(query, EXIT_FAILED, f"{type(exc).__name__}: {exc}")
        end_failed_run(query, sink)
        return code
    except TwoPhaseError as exc:
        return fail(query, EXIT_REFUSED, f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # Spark's analysis errors carry the sink's ConfigError
        return fail(query, EXIT_REFUSED, explain(exc))
    try:
        return wait(query, sink, args.available_now)
    finally:  # the run is over however the query ended: operators need no --force
        tps.end_query(query, sink)


def end_failed_run(query: Any, sink: Any) -> None:
    """Record that the run which claimed the sinks failed, so that operators' commands
    need no --force for it."""
    if query is None:
        return
    from twophase.protocol.ledger.runs import FAILED
    from twophase.spark.query_end import end_run, run_of

    end_run(*run_of(query, sink), FAILED)


def wait(query: Any, sink: Any, available_now: bool) -> int:
    """Until the query finished (available-now) and its promotions ended, or failed; the
    exit status."""
    from twophase.spark import drain_query

    try:
        await_reporting(query)
    except Exception as exc:
        return fail(query, EXIT_FAILED, explain(exc))
    if query.exception() is not None:
        return fail(query, EXIT_FAILED, explain(query.exception()))
    if not available_now:
        return fail(query, EXIT_FAILED, "the query stopped unexpectedly")
    try:  # with background promotion, the last epoch may still be on its way
        drain_query(sink)
    except Exception as exc:
        return fail(query, EXIT_FAILED, explain(exc))
    emit("DONE")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:  # before run(), which opens the sink in a thread of its own
        logs.configure(args.log_format)
    except ConfigError as exc:
        return fail(None, EXIT_REFUSED, str(exc))
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
