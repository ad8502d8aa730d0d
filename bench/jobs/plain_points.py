"""One point per CSV row with the plain ``foreachBatch`` a user writes instead, without
any of twophase's code; at-least-once (a replayed batch is written again).

::

    python bench/jobs/plain_points.py --input DIR --checkpoint DIR --target influxdb|postgresql

* ``influxdb``: each partition formats line protocol by hand (tags and strings escaped)
  and POSTs it to InfluxDB 1.x ``/write`` in requests of 5,000 lines with urllib3
  (``PLAIN_INFLUX_WRITE_URL``: the ``/write?db=...`` URL);
* ``postgresql``: the table made at start, then each partition upserts its rows with
  psycopg's ``executemany`` (``INSERT ... ON CONFLICT DO UPDATE``), 5,000 rows a call,
  one transaction a partition (``PLAIN_PG_URL``, the password from ``PGPASSWORD``).
"""

from __future__ import annotations

import calendar
import os
import sys
from collections.abc import Callable, Iterable
from datetime import timezone
from typing import Any

from bench.jobs.common import MEASUREMENT, parse_args, read_csv, session

BATCH = 5000
CREATE = """
CREATE TABLE IF NOT EXISTS host_stats (
    time timestamptz NOT NULL, host text NOT NULL, region text NOT NULL,
    cpu double precision, requests bigint, healthy boolean, status text,
    UNIQUE (time, host, region)
)"""
UPSERT = """
INSERT INTO host_stats (time, host, region, cpu, requests, healthy, status)
VALUES (%s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (time, host, region) DO UPDATE SET cpu = EXCLUDED.cpu,
    requests = EXCLUDED.requests, healthy = EXCLUDED.healthy, status = EXCLUDED.status"""


def tag(value: str) -> str:
    return value.replace(",", r"\,").replace("=", r"\=").replace(" ", r"\ ")


def text(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def line(r: Any) -> str:
    """A row as a line; its time (naive, in the process's zone: UTC) in nanoseconds."""
    ns = calendar.timegm(r.time.timetuple()) * 1_000_000_000 + r.time.microsecond * 1000
    return (
        f"{MEASUREMENT},host={tag(r.host)},region={tag(r.region)} cpu={r.cpu!r},"
        f"requests={r.requests}i,healthy={'true' if r.healthy else 'false'},"
        f"status={text(r.status)} {ns}"
    )


def influx_partition(url: str) -> Callable[[Iterable[Any]], None]:
    def write(rows: Iterable[Any]) -> None:
        import urllib3

        http, batch = urllib3.PoolManager(), []
        for r in rows:
            batch.append(line(r))
            if len(batch) == BATCH:
                post(http, url, batch)
                batch = []
        if batch:
            post(http, url, batch)

    return write


def post(http: Any, url: str, lines: list[str]) -> None:
    response = http.request("POST", url, body="\n".join(lines).encode())
    if response.status >= 300:
        raise RuntimeError(f"InfluxDB refused a write ({response.status}): {response.data!r}")


def pg_partition(url: str) -> Callable[[Iterable[Any]], None]:
    def write(rows: Iterable[Any]) -> None:
        import psycopg

        with psycopg.connect(url) as conn, conn.cursor() as cur:
            batch: list[tuple[Any, ...]] = []
            for r in rows:
                batch.append(
                    (
                        r.time.replace(tzinfo=timezone.utc),
                        r.host,
                        r.region,
                        r.cpu,
                        r.requests,
                        r.healthy,
                        r.status,
                    )
                )
                if len(batch) == BATCH:
                    cur.executemany(UPSERT, batch)
                    batch = []
            if batch:
                cur.executemany(UPSERT, batch)

    return write


def writer(target: str) -> Callable[[Iterable[Any]], None]:
    if target == "influxdb":
        return influx_partition(os.environ["PLAIN_INFLUX_WRITE_URL"])
    import psycopg

    with psycopg.connect(os.environ["PLAIN_PG_URL"]) as conn:
        conn.execute(CREATE)
    return pg_partition(os.environ["PLAIN_PG_URL"])


def main() -> int:
    args = parse_args(sys.argv[1:], "--target")
    spark = session(args, "plain-points")
    write = writer(args.target)

    def each_batch(df: Any, batch_id: int) -> None:
        df.foreachPartition(write)

    query = (
        read_csv(spark, args)
        .writeStream.foreachBatch(each_batch)
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
