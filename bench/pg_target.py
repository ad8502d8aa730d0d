"""``python -m bench pg_target``: twophase into a PostgreSQL target against the plain
``foreachBatch`` upsert a user writes today, in one run.

::

    python -m bench pg_target [--sizes 100000,1000000] [--epochs N] [--reps N] [--quick]
        [--out DIR]

Per epoch size, the CSV pipeline of ``bench/costs_job.py`` (one point per row,
``host_stats``) runs as a Spark job of its own (``bench/pg_target_job.py``), once per
side and repeat, the sides alternating (twophase, plain; plain, twophase; ...:
:func:`bench.spark_runs.rotated_runs`):

* ``twophase``: ``foreach_batch_writer`` with the target ``postgresql://...`` (kind
  ``postgresql``, ``target_create_tables = true``), its staging database migrated by
  Alembic;
* ``plain``: a ``foreachPartition`` upserting with psycopg's ``executemany``
  (``INSERT ... ON CONFLICT (time, host, region) DO UPDATE``), written without
  twophase's code.

Both read the same generated files: ``--epochs`` micro-batches of the size, each from
4 files (so 4 partitions a batch, as a source with several partitions gives). Every
run writes into a target database of its own (and twophase into a staging database
of its own), checked afterwards to hold every point, then dropped. Figures per run:
the steady points/s (the input rows of the batches after the first over their summed
``triggerExecution``), the wall time, the CPU of the driver, the JVM, the Python
workers and the PostgreSQL backends of the run's databases, and where the time goes
(twophase: each epoch's ``steps_ms`` from the commit's log record; plain: the
task-seconds of its partitions and of their ``executemany``). The ratio per size is
twophase's median steady points/s over plain's (target: at least 0.9).

Writes ``bench/results/pg-target-<stamp>.json``, ``.md`` and ``.png``; prints the
Markdown.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy.engine import make_url

from bench import pg_target_report, report
from bench.context import Context
from bench.costs_spark import Backends, write_csv
from bench.pg_target_job import PLAIN, QUERY, TABLE, TWOPHASE
from bench.plan import FULL, QUICK
from bench.report import RESULTS, machine, stamp
from bench.servers import Servers, admin_conninfo, drop_staging, scratch
from bench.sides import BenchError
from bench.spark_runs import (
    Run,
    compression,
    job_command,
    job_env,
    missing,
    rotated_runs,
    run_job,
)
from twophase.config import TargetConfig, env_name

ENTRY = ["-m", "bench.pg_target_job"]
SIDES = (TWOPHASE, PLAIN)
FILES_PER_EPOCH = 4  # partitions per micro-batch
STEADY_AFTER = 1  # batch 0 carries Spark's start-up and the table's creation


@dataclass(frozen=True)
class Plan:
    """What one run measures: epoch sizes (points), epochs per job, repeats per side."""

    name: str
    sizes: tuple[int, ...]
    epochs: int
    reps: int

    @property
    def steady_after(self) -> int:
        return min(STEADY_AFTER, self.epochs - 1)


FULL_PLAN = Plan("full", (100_000, 1_000_000), epochs=5, reps=3)
QUICK_PLAN = Plan("quick", (100_000,), epochs=3, reps=1)


# -- the target databases -----------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A scratch target database: its URL as a user writes it (no password), the
    password apart, and its name."""

    url: str
    password: str
    database: str


@contextmanager
def target_database(servers: Servers, name: str) -> Iterator[Target]:
    """A fresh, empty database on the dev PostgreSQL (the staging server), dropped after."""
    with psycopg.connect(admin_conninfo(servers.staging_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')  # name: the bench's own prefix and hex
    base = make_url(servers.staging_url)
    url = f"postgresql://{base.username}@{base.host}:{base.port or 5432}/{name}"
    try:
        yield Target(url, str(base.password or ""), name)
    finally:
        drop_staging(servers, name)


def target_env(staging_url: str | None, target: Target) -> dict[str, str]:
    """A job's environment (:func:`bench.spark_runs.job_env`'s) pointed at ``target``:
    the kind, ``target_create_tables`` and the password for twophase, ``PGPASSWORD``
    for the plain writer; no InfluxDB setting left over."""
    env = job_env(staging_url, TargetConfig(url=target.url))
    for name in ("influx_api", "influx_db", "targets"):
        env.pop(env_name(name), None)
    env |= {
        env_name("target_url"): target.url,
        env_name("target_kind"): "postgresql",
        env_name("target_create_tables"): "true",
        env_name("target_password"): target.password,
        "PGPASSWORD": target.password,
    }
    return env


def count_rows(target: Target) -> int:
    with psycopg.connect(target.url, password=target.password) as conn:
        found = conn.execute(f"SELECT count(*) FROM {TABLE}").fetchone()  # noqa: S608 constant
    return int(found[0]) if found else 0


# -- one run ----------------------------------------------------------------------------


def pg_run(ctx: Context, side: str, input_dir: Path, plan: Plan, points: int) -> dict[str, Any]:
    """One job of ``side`` into databases of its own (checked, then dropped)."""
    name = f"pg_{side}_{uuid.uuid4().hex[:8]}"
    work = input_dir.parent
    try:
        staging = ctx.scratch.staging_url(name) if side == TWOPHASE else None
        with target_database(ctx.scratch.servers, f"{ctx.scratch.prefix}_{name}_t") as target:
            cmd = job_command(ENTRY, input_dir, work / name, f"bench-{name}", FILES_PER_EPOCH)
            databases = [target.database] + ([f"{ctx.scratch.prefix}_{name}"] if staging else [])
            with watched(ctx, databases) as backends:
                run = run_job(
                    [*cmd, "--sink", side],
                    target_env(staging, target),
                    work / f"{name}.stderr",
                    side,
                    plan.steady_after,
                    QUERY,
                )
            got = count_rows(target)
            if got != points * plan.epochs:
                raise BenchError(f"{side}: the target holds {got} rows, not {points * plan.epochs}")
            cpu = {**run.records.get("CPU", {}), **_backend_cpu(backends, databases)}
            return figures(run, cpu, points * plan.epochs, plan.steady_after)
    finally:
        ctx.scratch.drop(name)


@contextmanager
def watched(ctx: Context, databases: Sequence[str]) -> Iterator[list[Backends]]:
    """The CPU of each database's PostgreSQL backends, sampled while open."""
    conninfo = admin_conninfo(ctx.scratch.servers.staging_url)
    backends = [Backends(conninfo, database) for database in databases]
    for watch in backends:
        watch.__enter__()
    try:
        yield backends
    finally:
        for watch in backends:
            watch.__exit__(None, None, None)


def _backend_cpu(backends: Sequence[Backends], databases: Sequence[str]) -> dict[str, float]:
    cpu = dict(zip(databases, (b.cpu_s for b in backends), strict=True))
    return {
        "target_pg": round(cpu[databases[0]], 3),
        "staging_pg": round(cpu[databases[1]], 3) if len(databases) > 1 else 0.0,
    }


def figures(run: Run, cpu: dict[str, float], points: int, steady_after: int) -> dict[str, Any]:
    """A run's figures for the results file."""
    stages = dict(run.records.get("STAGES", {}))
    if "steps_ms" in stages:  # twophase: the steady epochs' steps only
        stages["steps_ms"] = stages["steps_ms"][steady_after:]
    return {
        "wall_s": round(run.wall_s, 3),
        "first_batch_s": round(run.first_batch_s, 3),
        "steady_ms": run.steady_ms,
        "steady_points_per_s": round(run.steady_rows_per_s),
        "cpu_s": cpu,
        "cpu_s_per_million": {k: round(v / points * 1e6, 3) for k, v in cpu.items()},
        "stages": stages,
    }


# -- a size, the sides alternating ------------------------------------------------------------


def measure_size(ctx: Context, plan: Plan, size: int, tmp: Path) -> dict[str, Any]:
    """Both sides at ``size`` points per epoch, ``plan.reps`` times each, alternating."""
    input_dir = tmp / f"input-{size}"
    per_file = max(1, size // FILES_PER_EPOCH)
    write_csv(input_dir, per_file, FILES_PER_EPOCH * plan.epochs)
    points = per_file * FILES_PER_EPOCH
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}

    def one(side: str, repeat: int) -> Run:
        ctx.log(f"pg_target {size:,}: {side}, {repeat + 1}/{plan.reps}")
        runs[side].append(pg_run(ctx, side, input_dir, plan, points))
        return Run(runs[side][-1]["wall_s"], 0.0, 0.0, 0.0)

    try:
        rotated_runs(SIDES, plan.reps, one)
    finally:
        for path in input_dir.iterdir():  # 60 MB per million points: free it before the next
            path.unlink()
    return {"points_per_epoch": points, "epochs": plan.epochs, "runs": runs}


def run(plan: Plan) -> dict[str, Any]:
    reason = missing()
    if reason is not None:
        raise BenchError(f"Spark not available: {reason}")
    started, clock = stamp(), time.monotonic()
    results: dict[str, Any] = {
        "started": started,
        "plan": f"pg-target-{plan.name}",
        "settings": {
            "sizes": list(plan.sizes),
            "epochs": plan.epochs,
            "reps": plan.reps,
            "compression": compression(),  # what twophase's side stages with
        },
        "machine": machine(),
        "checkout": report.checkout(),
    }
    with (
        scratch(Servers.from_env()) as made,
        tempfile.TemporaryDirectory(prefix="twophase-bench-pg-") as tmp,
    ):
        ctx = Context(QUICK if plan.name == "quick" else FULL, made)
        try:
            results["sizes"] = {
                str(size): measure_size(ctx, plan, size, Path(tmp)) for size in plan.sizes
            }
        finally:
            ctx.close()
    results["seconds"] = round(time.monotonic() - clock, 1)
    results["rows"] = pg_target_report.rows(results["sizes"])
    return results


def write(results: dict[str, Any], folder: Path) -> dict[str, Path]:
    base = folder / f"pg-target-{results['started']}"
    return report.write_files(results, base, pg_target_report.markdown, pg_target_report.chart)


def plan_of(args: argparse.Namespace) -> Plan:
    base = QUICK_PLAN if args.quick else FULL_PLAN
    sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else base.sizes
    return Plan(
        base.name if args.sizes is None and args.epochs is None and args.reps is None else "custom",
        sizes,
        args.epochs or base.epochs,
        args.reps or base.reps,
    )


def parse(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench pg_target", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="100k points, 3 epochs, 1 repeat")
    ap.add_argument("--sizes", default=None, help="points per epoch (default 100000,1000000)")
    ap.add_argument("--epochs", type=int, default=None, help="epochs per job (default 5; >= 2)")
    ap.add_argument("--reps", type=int, default=None, help="jobs per side and size (default 3)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="default: bench/results")
    args = ap.parse_args(argv)
    if args.epochs is not None and args.epochs < 2:
        ap.error("--epochs: at least 2 (the first is not counted)")
    return args


def main(argv: Sequence[str]) -> int:
    """``python -m bench pg_target [--sizes N,N] [--epochs N] [--reps N] [--quick]``."""
    args = parse(argv)
    results = run(plan_of(args))
    return report.finish(pg_target_report.markdown(results), write(results, args.out))
