"""What users time: a whole pipeline, one process from launch to exit, twophase against
the plain ``foreachBatch`` a user writes instead (``bench/jobs/plain_*.py``, no twophase
code). Every run: trigger availableNow, 1 file a trigger, ``local[2,4]``, databases of
its own (checked to hold every point, then dropped).

* ``points``: one point per CSV row (TimestampType, tags with quotes, spaces, commas
  and unicode, a float, an int, a bool and a string field), 12 files x 25,000 rows,
  ``foreachBatch(foreach_batch_writer(...))`` as the README writes it, against
  partitions POSTing line protocol to ``/write``;
* ``points_source``: the same through the data source, ``format("twophase")``;
* ``sessions``: the seeds' job ``jobs/session_metrics.py`` (aggregates, a few hundred
  points a batch, 21 files) against the same aggregation written plainly;
* ``points_pg``: the ``points`` pipeline into a PostgreSQL target (twophase's
  ``postgresql`` kind) against partitions upserting with psycopg ``executemany``.

Figures (:mod:`bench.harness.spark`): wall, startup, first batch, steady batch (from
the checkpoint's ``offsets/N`` and ``commits/N``), and CPU seconds of the job's
processes, PostgreSQL and InfluxDB. Ratios: plain over twophase.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg

from bench.harness.scenario import Context, Figures, Scenario
from bench.harness.servers import REPO, PgTarget, admin_conninfo, pg_target
from bench.harness.sides import BenchError
from bench.harness.spark import MASTER, job_env, missing, run_job, spark_submit
from twophase.config import env_name
from twophase.influx.query import query_v1

HOSTS = tuple(f'web "{i}", rack {i % 7}' for i in range(40))
REGIONS = ("eu west", "São Paulo", "東京 1", "us=east,2")
STATUS = ("ok", 'slow "disk"', "down, since 10:00", "ünïcode ✓")
START = datetime(2026, 11, 1, tzinfo=timezone.utc)


def row(i: int) -> list[object]:
    """Row ``i``: its own millisecond, so every row is a point of its own."""
    at = START + timedelta(milliseconds=i)
    stamp = at.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    host, region, status = HOSTS[i % len(HOSTS)], REGIONS[i % len(REGIONS)], STATUS[i % 4]
    return [stamp, host, region, i % 1000 / 7, i % 5000, "true" if i % 3 else "false", status]


def write_csv(folder: Path, files: int, rows: int) -> None:
    """``files`` CSV files of ``rows`` rows each, with a header."""
    folder.mkdir(parents=True)
    for f in range(files):
        with open(folder / f"part-{f:03d}.csv", "w", newline="", encoding="utf-8") as out:
            w = csv.writer(out)
            w.writerow(["time", "host", "region", "cpu", "requests", "healthy", "status"])
            w.writerows(row(f * rows + r) for r in range(rows))


def cases(quick: bool) -> dict[str, Any]:
    files, rows, sessions = (2, 200, 3) if quick else (12, 25_000, 21)
    return {
        "points": {"kind": "points", "target": "influxdb", "files": files, "rows": rows},
        "points_source": {
            "kind": "points",
            "target": "influxdb",
            "files": files,
            "rows": rows,
            "writer": "source",
        },
        "sessions": {"kind": "sessions", "files": sessions},
        "points_pg": {"kind": "points", "target": "postgresql", "files": files, "rows": rows},
    }


def prepare(ctx: Context, case: dict[str, Any]) -> None:
    reason = missing()
    if reason:
        raise BenchError(f"pipelines cannot run: {reason}")
    folder = ctx.work / f"input-{case['kind']}-{case['files']}"
    case["input"] = folder
    if folder.exists():
        return
    if case["kind"] == "points":
        write_csv(folder, case["files"], case["rows"])
        return
    generate = [sys.executable, str(REPO / "jobs" / "generate_events.py"), "--out", str(folder)]
    subprocess.run([*generate, "--files", str(case["files"])], check=True, capture_output=True)


def influx_count(ctx: Context, database: str) -> int:
    url = ctx.scratch.servers.influx_url
    found = query_v1(url, database, 'SELECT count("cpu") FROM "host_stats"')
    return int(found[0]["values"][0][1]) if found else 0


def command(side: str, case: dict[str, Any], checkpoint: Path, sink_id: str) -> list[str]:
    """The job as users launch it: ``spark-submit`` with the master and the job's options."""
    submit = [spark_submit(), "--master", MASTER, "--conf", "spark.ui.enabled=false"]
    common = ["--input", str(case["input"]), "--checkpoint", str(checkpoint)]
    if case["kind"] == "sessions":
        if side == "plain":
            return [*submit, str(REPO / "bench/jobs/plain_sessions.py"), *common]
        job = [*submit, str(REPO / "jobs/session_metrics.py"), *common]
        return [*job, "--sink-id", sink_id, "--available-now", "--max-files-per-trigger", "1"]
    if side == "plain":
        job = [*submit, str(REPO / "bench/jobs/plain_points.py"), *common]
        return [*job, "--target", case["target"]]
    job = [*submit, str(REPO / "bench/jobs/twophase_points.py"), *common, "--sink-id", sink_id]
    return [*job, "--writer", case.get("writer", "foreach")]


def run(ctx: Context, side: str, case: dict[str, Any]) -> Figures:
    """One job into databases of its own (a staging one for twophase), checked to hold
    every point, then dropped."""
    role = f"r{ctx.fresh():03d}"
    settings: dict[str, str] = {}
    if side == "twophase":
        settings[env_name("staging_url")] = ctx.scratch.staging_url(f"{role}s")
    checkpoint = ctx.work / f"{role}-{side}"
    cmd = command(side, case, checkpoint, f"bench-{role}")
    query = checkpoint / "stats" if case["kind"] == "sessions" else checkpoint

    def job(more: dict[str, str]) -> Figures:
        conninfo = admin_conninfo(ctx.scratch.servers.staging_url)
        log, prefix = ctx.work / f"{role}-{side}.log", f"{ctx.scratch.prefix}_{role}"
        return run_job(cmd, job_env(settings | more), log, query, conninfo, prefix)

    try:
        if case.get("target") == "postgresql":
            with pg_target(ctx.scratch.servers, f"{ctx.scratch.prefix}_{role}t") as target:
                figures = job(pg_settings(target))
                _check(pg_count(target), case, side)
                return figures
        db = ctx.scratch.influx(f"{role}i").influxdb.database or ""
        figures = job(influx_settings(ctx, db, "s" if case["kind"] == "sessions" else "ns"))
        if case["kind"] == "points":
            _check(influx_count(ctx, db), case, side)
        return figures
    finally:
        ctx.scratch.drop(f"{role}s")
        ctx.scratch.drop(f"{role}i")


def influx_settings(ctx: Context, db: str, precision: str) -> dict[str, str]:
    """Both sides' settings for the InfluxDB database ``db``."""
    url = ctx.scratch.servers.influx_url
    return {
        env_name("target_url"): url,
        env_name("influx_api"): "v1",
        env_name("influx_db"): db,
        "PLAIN_INFLUX_WRITE_URL": f"{url}/write?db={db}&precision={precision}",
    }


def pg_settings(target: PgTarget) -> dict[str, str]:
    """Both sides' settings for a PostgreSQL target (the password in the environment)."""
    return {
        env_name("target_url"): target.url,
        env_name("target_kind"): "postgresql",
        env_name("target_create_tables"): "true",
        env_name("target_password"): target.password,
        "PLAIN_PG_URL": target.url,
        "PGPASSWORD": target.password,
    }


def pg_count(target: PgTarget) -> int:
    with psycopg.connect(target.url, password=target.password) as conn:
        found = conn.execute("SELECT count(*) FROM host_stats").fetchone()
    return int(found[0]) if found else 0


def _check(found: int, case: dict[str, Any], side: str) -> None:
    expected = case["files"] * case["rows"]
    if found != expected:
        raise BenchError(f"{side}: the target holds {found} points, not {expected}")


SCENARIO = Scenario(
    name="pipelines",
    about="whole pipelines, launch to exit: twophase against a plain foreachBatch",
    sides=("twophase", "plain"),
    cases=cases,
    run=run,
    prepare=prepare,
    repeats=(1, 3),
    headline=(
        "wall_s",
        "first_batch_s",
        "steady_batch_s",
        "cpu_job_s",
        "cpu_postgres_s",
        "cpu_influxd_s",
    ),
    notes=(
        "startup_s: launch to offsets/0; first_batch_s: commits/0 - offsets/0; "
        "steady_batch_s: median of commits/N - offsets/N, N >= 1; tail_s: last commit to "
        "exit; wall_s: launch to exit",
        "cpu_job_s: the job's driver, JVM and Python workers; cpu_postgres_s: the backends "
        "of the run's databases, sampled every 0.1 s (a connection that lives less than "
        "that can be missed); cpu_influxd_s: the whole InfluxDB server (shared)",
        "plain / twophase above 1: twophase took less",
    ),
)
