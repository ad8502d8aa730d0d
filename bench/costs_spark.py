"""``bench.costs``'s Spark parts: the one-point-per-row CSV pipeline (three sinks, CPU
per process, profiles) and the seeds' job against its plain pipeline.

Each Spark run is one process timed from its start (:mod:`bench.spark_runs`). Besides
the job's own ``CPU`` record (driver, JVM, Python workers: ``bench/costs_job.py``),
a thread here samples the PostgreSQL backends of the run's staging database every
0.2 s (:mod:`bench.taskcpu`; a backend's last 0.2 s before it exits can be missed)
and the dev influxd's CPU around the run (:mod:`bench.cpu`; shared with anything
else writing to it).
"""

from __future__ import annotations

import pstats
import statistics
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psycopg

from bench import spark_e2e
from bench.context import Context
from bench.costs_job import COLUMNS, NOOP, PLAIN, QUERY, TWOPHASE
from bench.cpu import influxd_pid, process_cpu_s
from bench.servers import admin_conninfo
from bench.sides import BenchError
from bench.spark_runs import Run, job_command, job_env, missing, rotated_runs, run_job
from bench.taskcpu import task_cpu_s
from twophase.influx.query import query_v1

ENTRY = ["-m", "bench.costs_job"]
CSV_SIDES = (PLAIN, TWOPHASE, NOOP)
STEADY_AFTER = 2  # batch 0 carries start-up, batch 1 the rest of the warm-up
T0_MS = int(datetime(2026, 11, 27, tzinfo=timezone.utc).timestamp() * 1000)
REGIONS = ("eu-west", "us-east", "ap-south")
HOSTS = 1000
PROCESSES = ("driver", "jvm", "workers", "postgres", "influxd")
# (step, file name part, function): cumulative seconds per foreachBatch call in a profile
STEPS: dict[str, tuple[tuple[str, str, str], ...]] = {
    TWOPHASE: (
        ("foreachBatch call", "spark/foreach.py", "__call__"),
        ("stage: Spark tasks (encode, compress, COPY), driver waits", "pyspark", "collect"),
        ("decide", "protocol/ledger/epoch_ledger.py", "decide"),
        ("promote (read, send)", "protocol/commit/promoter.py", "promote"),
        ("mark", "protocol/ledger/epoch_ledger.py", "mark_committed"),
    ),
    PLAIN: (
        ("foreachBatch call", "bench/costs_job.py", "each_batch"),
        ("Spark tasks (rows to Python, format, POST), driver waits", "pyspark", "foreachPartition"),
    ),
}


# -- input ------------------------------------------------------------------------------


def csv_line(i: int) -> str:
    """Row ``i`` of the input: a distinct point (its own millisecond)."""
    return (
        f"{T0_MS + i},web-{i % HOSTS},{REGIONS[i % 3]},{i * 37 % 10_000 / 100},"
        f"{i * 7919 % (1 << 32)},{i % 5000}\n"
    )


def write_csv(folder: Path, rows_per_file: int, files: int) -> list[Path]:
    folder.mkdir(parents=True)
    paths = []
    for f in range(files):
        path = folder / f"part-{f:04d}.csv"
        with open(path, "w") as out:
            out.write(",".join(COLUMNS) + "\n")
            out.writelines(csv_line(i) for i in range(f * rows_per_file, (f + 1) * rows_per_file))
        paths.append(path)
    return paths


# -- CPU of the servers during a run ----------------------------------------------------------


class Backends:
    """Samples the CPU of the PostgreSQL backends connected to ``database`` while open."""

    def __init__(self, conninfo: str, database: str, every_s: float = 0.2) -> None:
        self._conninfo, self._database, self._every = conninfo, database, every_s
        self.seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _sample(self, conn: psycopg.Connection[Any]) -> None:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s", (self._database,)
        ).fetchall()
        for (pid,) in rows:
            self.seen[int(pid)] = max(self.seen.get(int(pid), 0.0), task_cpu_s(int(pid)))

    def _watch(self) -> None:
        with psycopg.connect(self._conninfo, autocommit=True) as conn:
            while not self._stop.wait(self._every):
                self._sample(conn)
            self._sample(conn)

    def __enter__(self) -> Backends:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    @property
    def cpu_s(self) -> float:
        return sum(self.seen.values())


@contextmanager
def server_cpu(ctx: Context, database: str | None) -> Iterator[dict[str, float]]:
    """CPU seconds of the run's staging backends (``database``; None: none) and influxd."""
    spent: dict[str, float] = {}
    influxd = influxd_pid()
    before = process_cpu_s(influxd) if influxd else 0.0
    conninfo = admin_conninfo(ctx.scratch.servers.staging_url)
    watch = Backends(conninfo, database) if database else None
    if watch is not None:
        watch.__enter__()
    try:
        yield spent
    finally:
        if watch is not None:
            watch.__exit__(None, None, None)
        spent["postgres"] = round(watch.cpu_s, 3) if watch is not None else 0.0
        spent["influxd"] = round((process_cpu_s(influxd) if influxd else 0.0) - before, 3)


# -- the CSV pipeline -------------------------------------------------------------------------


def csv_run(
    ctx: Context, side: str, input_dir: Path, points: int, profile: Path | None = None
) -> dict[str, Any]:
    """One run of ``side`` into databases of its own (checked, then dropped)."""
    name = f"costs_{side}_{uuid.uuid4().hex[:8]}"
    influx = ctx.scratch.influx(name)
    work = input_dir.parent
    try:
        staging = ctx.scratch.staging_url(name) if side == TWOPHASE else None
        cmd = [*job_command(ENTRY, input_dir, work / name, f"bench-{name}", 1), "--sink", side]
        if profile is not None:
            cmd += ["--profile", str(profile)]
        env = job_env(staging, influx)
        database = f"{ctx.scratch.prefix}_{name}" if staging else None
        with server_cpu(ctx, database) as servers:
            run = run_job(cmd, env, work / f"{name}.stderr", side, STEADY_AFTER, QUERY)
        if side != NOOP:
            _check(influx.url, str(influx.influxdb.database), points, side)
        return _figures(run, servers, points)
    finally:
        ctx.scratch.drop(name)


def _check(url: str, database: str, expected: int, side: str) -> None:
    series = query_v1(url, database, "SELECT count(cpu) FROM host_stats", timeout_s=120)
    got = int(series[0]["values"][0][1]) if series else 0
    if got != expected:
        raise BenchError(f"{side}: InfluxDB holds {got} points, expected {expected}")


def _figures(run: Run, servers: dict[str, float], points: int) -> dict[str, Any]:
    cpu = {**run.records.get("CPU", {}), **servers}
    return {
        "wall_s": round(run.wall_s, 3),
        "first_batch_s": round(run.first_batch_s, 3),
        "steady_ms": run.steady_ms,
        "steady_points_per_s": round(run.steady_rows_per_s),
        "cpu_s": cpu,
        "cpu_s_per_million": {k: round(v / points * 1e6, 3) for k, v in cpu.items()},
        "stages": run.records.get("STAGES", {}),
    }


def measure_csv(ctx: Context, rows_per_file: int, files: int, repeats: int) -> dict[str, Any]:
    """Every side ``repeats`` times, rotated; then one profiled run of each writer."""
    reason = missing()
    if reason is not None:
        raise BenchError(f"Spark not available: {reason}")
    points = rows_per_file * files
    with tempfile.TemporaryDirectory(prefix="twophase-bench-costs-") as tmp:
        input_dir = Path(tmp) / "input"
        write_csv(input_dir, rows_per_file, files)

        def one(side: str, repeat: int) -> Run:
            ctx.log(f"costs csv: {side}, {repeat + 1}/{repeats}")
            figures = csv_run(ctx, side, input_dir, points)
            runs[side].append(figures)
            return Run(figures["wall_s"], 0.0, 0.0, 0.0)

        runs: dict[str, list[dict[str, Any]]] = {side: [] for side in CSV_SIDES}
        rotated_runs(CSV_SIDES, repeats, one)
        profiles = {side: _profiled(ctx, side, input_dir, points) for side in (PLAIN, TWOPHASE)}
    return {
        "points": points,
        "rows_per_batch": rows_per_file,
        "batches": files,
        "repeats": repeats,
        "runs": runs,
        "profiles": profiles,
    }


def _profiled(ctx: Context, side: str, input_dir: Path, points: int) -> dict[str, Any]:
    ctx.log(f"costs csv: {side}, profiled run")
    path = input_dir.parent / f"{side}.prof"
    figures = csv_run(ctx, side, input_dir, points, profile=path)
    return {"wall_s": figures["wall_s"], **profile_summary(path, STEPS[side])}


def profile_summary(path: Path, steps: Sequence[tuple[str, str, str]]) -> dict[str, Any]:
    """Per step, the cumulative seconds per foreachBatch call; the top functions."""
    stats = pstats.Stats(str(path))
    table: dict[tuple[str, int, str], tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    calls = max(1, _match(table, steps[0][1], steps[0][2])[0])
    per_call = {
        step: round(_match(table, where, func)[1] / calls * 1000, 1) for step, where, func in steps
    }
    top = sorted(table.items(), key=lambda kv: kv[1][3], reverse=True)[:15]
    return {
        "calls": calls,
        "steps_ms_per_batch": per_call,
        "top_cumulative": [
            {"function": f"{Path(f).name}:{line} {func}", "calls": v[1], "cum_s": round(v[3], 3)}
            for (f, line, func), v in top
        ],
    }


def _match(
    table: dict[tuple[str, int, str], tuple[Any, ...]], where: str, func: str
) -> tuple[int, float]:
    """(calls, cumulative seconds) of the matching function with the most time."""
    found = [(v[1], v[3]) for (f, _, name), v in table.items() if name == func and where in f]
    return max(found, key=lambda pair: pair[1], default=(0, 0.0))


# -- the seeds' job ---------------------------------------------------------------------------


def measure_seeds(ctx: Context, triggers: Sequence[int], repeats: int) -> dict[str, Any]:
    """``jobs/session_metrics.py`` against ``bench/spark_plain.py`` (metric 6's runs)."""
    reason = missing(spark_e2e.JOB)
    if reason is not None:
        raise BenchError(f"Spark not available: {reason}")
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="twophase-bench-costs-seeds-") as tmp:
        work = Path(tmp)
        inputs = spark_e2e.generate_inputs(work / "input")
        for per_trigger in triggers:
            run = _seeds_run(ctx, inputs[per_trigger], per_trigger, work, repeats)
            runs = rotated_runs(("job", "plain"), repeats, run)
            out[str(per_trigger)] = {
                side: [{"wall_s": round(r.wall_s, 3), "steady_ms": r.steady_ms} for r in side_runs]
                for side, side_runs in runs.items()
            }
    return out


def _seeds_run(
    ctx: Context, input_dir: Path, per_trigger: int, work: Path, repeats: int
) -> Callable[[str, int], Run]:
    def run(side: str, repeat: int) -> Run:
        ctx.log(f"costs seeds: {side}, {per_trigger} file(s)/trigger, {repeat + 1}/{repeats}")
        return spark_e2e.run_spark_job(ctx, side, input_dir, per_trigger, work)

    return run


def median_of(runs: Sequence[dict[str, Any]], *keys: str) -> float:
    """The median over runs of ``run[keys[0]][keys[1]]...``."""
    values = []
    for run in runs:
        value: Any = run
        for key in keys:
            value = value.get(key, 0.0) if isinstance(value, dict) else 0.0
        values.append(float(value))
    return statistics.median(values)
