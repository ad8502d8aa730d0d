"""``bench.pg_target``'s pipeline: CSV files in, one row per point, into a PostgreSQL table.

::

    python -m bench.pg_target_job --input DIR --checkpoint DIR [--max-files-per-trigger N]
        [--available-now] [--master local[2,4]] --sink plain|twophase [--sink-id ID]

The CSV pipeline of ``bench/costs_job.py`` (its reading, its ``host_stats`` points:
tags ``host`` and ``region``, fields ``cpu``, ``mem``, ``requests``, time in ms),
written to a PostgreSQL database, the target's URL (``postgresql://user@host:port/db``,
no password) in ``TWOPHASE_TARGET_URL``:

* ``--sink twophase``: ``twophase.spark.foreach_batch_writer`` as for InfluxDB
  (``costs_job.twophase_sink``); the target's kind, its password and
  ``target_create_tables`` come from the environment. A handler on twophase's
  ``twophase.spark`` logger keeps each epoch's ``steps_ms`` (stage, recover, decide,
  promote) from the commit's log record.
* ``--sink plain``: the at-least-once ``foreachBatch`` a user writes today, without
  twophase's code: the table made at start (``CREATE TABLE IF NOT EXISTS``, the
  shape twophase creates: ``time timestamptz``, a text column per tag, typed fields,
  UNIQUE (time, tags)), then each partition upserts its rows with psycopg,
  ``INSERT ... ON CONFLICT (time, host, region) DO UPDATE``, ``executemany`` in
  batches of 5,000 rows, one transaction per partition; the password from libpq's
  ``PGPASSWORD``. It adds up in accumulators the seconds its partitions spent and
  the seconds of their ``executemany`` calls.

At the end it prints ``STAGES`` (plain: the accumulators; twophase: ``steps_ms``, one
object per epoch) and ``CPU`` (driver, JVM, Python workers), then ``DONE``; one
``PROGRESS`` line per micro-batch, like the other bench jobs.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timezone
from typing import Any

from bench.costs_job import process_cpu, rows, twophase_sink
from bench.spark_plain import emit, end_job, parser, report_progress, session
from bench.spark_plain import start as start_query

QUERY = "pg_target"
TABLE = "host_stats"  # costs_job.MEASUREMENT: twophase names the table after it
PER_EXECUTE = 5000
PLAIN, TWOPHASE = "plain", "twophase"

# The plain writer's SQL, as a user writes it for the table twophase would create.
CREATE = """
CREATE TABLE IF NOT EXISTS host_stats (
    time timestamptz NOT NULL,
    host text NOT NULL DEFAULT '',
    region text NOT NULL DEFAULT '',
    cpu double precision,
    mem bigint,
    requests bigint,
    UNIQUE (time, host, region)
)
"""
UPSERT = """
INSERT INTO host_stats (time, host, region, cpu, mem, requests)
VALUES (%s, %s, %s, %s, %s, %s)
ON CONFLICT (time, host, region) DO UPDATE
SET cpu = EXCLUDED.cpu, mem = EXCLUDED.mem, requests = EXCLUDED.requests
"""


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    ap = parser("python -m bench.pg_target_job")
    ap.add_argument("--sink", choices=(PLAIN, TWOPHASE), default=PLAIN)
    return ap.parse_args(argv)


# -- the plain writer: what a user writes ------------------------------------------------


def plain_sink(spark: Any) -> tuple[Callable[[Any, int], None], Callable[[], dict[str, Any]]]:
    """The plain ``foreachBatch`` function (its table made first), and what its
    accumulators add up to."""
    import psycopg

    url = os.environ["TWOPHASE_TARGET_URL"]  # the password: PGPASSWORD, read by libpq
    with psycopg.connect(url) as conn:
        conn.execute(CREATE)
    spent, executing = spark.sparkContext.accumulator(0.0), spark.sparkContext.accumulator(0.0)

    def write(partition: Iterable[Any]) -> None:
        import psycopg

        began, executed = time.perf_counter(), 0.0
        with psycopg.connect(url) as conn, conn.cursor() as cur:
            batch: list[tuple[Any, ...]] = []
            for r in partition:
                at = datetime.fromtimestamp(r.time / 1000, timezone.utc)
                batch.append((at, r.host, r.region, r.cpu, r.mem, r.requests))
                if len(batch) == PER_EXECUTE:
                    executed += _execute(cur, batch)
                    batch = []
            if batch:
                executed += _execute(cur, batch)
        spent.add(time.perf_counter() - began)
        executing.add(executed)

    def each_batch(df: Any, batch_id: int) -> None:
        df.foreachPartition(write)

    def stages() -> dict[str, Any]:
        return {"partitions_s": spent.value, "execute_s": executing.value}

    return each_batch, stages


def _execute(cur: Any, batch: list[tuple[Any, ...]]) -> float:
    began = time.perf_counter()
    cur.executemany(UPSERT, batch)
    return time.perf_counter() - began


# -- twophase's step timings --------------------------------------------------------------


class Steps(logging.Handler):
    """Keeps the ``steps_ms`` of every commit record twophase logs (one per epoch)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.epochs: list[dict[str, float]] = []

    def emit(self, record: logging.LogRecord) -> None:
        steps = getattr(record, "steps_ms", None)
        if isinstance(steps, dict):
            self.epochs.append({str(k): float(v) for k, v in steps.items()})

    def record(self) -> dict[str, Any]:
        """The ``STAGES`` record: every epoch's steps, in the order committed."""
        return {"steps_ms": self.epochs}

    @classmethod
    def installed(cls, logger: str = "twophase.spark") -> Steps:
        handler = cls()
        log = logging.getLogger(logger)
        log.addHandler(handler)
        log.setLevel(min(log.getEffectiveLevel(), logging.INFO))  # the record is at INFO
        return handler


# -- the job ---------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    started = time.monotonic()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    writer = twophase_sink(args.sink_id) if args.sink == TWOPHASE else None  # opens meanwhile
    steps = Steps.installed() if writer is not None else None
    spark = session(args, f"pg-target-{args.sink}")
    listener = report_progress(spark, started)
    sink: Callable[[Any, int], None]
    stages: Callable[[], dict[str, Any]]
    if writer is not None and steps is not None:
        sink, stages = writer, steps.record
    else:
        sink, stages = plain_sink(spark)
    query = start_query(rows(spark, args).writeStream.foreachBatch(sink), QUERY, args)

    def records() -> None:
        emit("STAGES", **stages())
        emit("CPU", **process_cpu())

    return end_job(spark, query, listener, started, writer, records)


if __name__ == "__main__":
    sys.exit(main())
