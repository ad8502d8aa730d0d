"""Metric 6: the session-metrics job end to end in Spark, twophase sink against a direct write.

Both jobs (and a diagnostic third: the twophase stats sink with the
dead-letter query on Spark's ``noop`` sink, as the direct job has it) read the
same generated input (``jobs/generate_events.py``) with
the same settings (``local[2]``, two files per trigger, available-now) and
print one ``PROGRESS`` line per micro-batch. Measured on the stats query:
input rows per second of batch time (sum of rows / sum of ``triggerExecution``
durations, over the batches after the first, which carries Spark's start-up)
and the median batch duration. Runs are rotated A B C, B C A, ...

Skipped with "not available yet" while ``jobs/session_metrics.py``,
``twophase.spark``, PySpark or Java are missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from bench.context import MAIN, Context
from bench.servers import REPO
from bench.sides import BenchError
from bench.stats import Summary, at_least_direct, rotated, skipped

JOB = REPO / "jobs" / "session_metrics.py"
TARGET = 0.8
FILES, EVENTS_PER_FILE, FILES_PER_TRIGGER = 22, 2000, 2
MASTER = "local[2]"
TIMEOUT_S = 600


def missing() -> str | None:
    """Why metric 6 cannot run here, or None."""
    if not JOB.exists():
        return "jobs/session_metrics.py is missing"
    for module in ("twophase.spark", "pyspark"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is missing"
    if shutil.which("java") is None:
        return "no java on PATH (scripts/dev.sh setup installs it)"
    return None


def generate_input(folder: Path) -> int:
    from jobs.generate_events import generate

    paths = generate(folder, files=FILES, events_per_file=EVENTS_PER_FILE, seed=7)
    return len(paths)


def job_env(ctx: Context, influx_role: str) -> dict[str, str]:
    influx = ctx.scratch.influx(influx_role)
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("TWOPHASE_CRASH")},
        "TWOPHASE_STAGING_URL": ctx.scratch.staging_url(MAIN),
        "TWOPHASE_INFLUX_URL": influx.url,
        "TWOPHASE_INFLUX_API": "v1",
        "TWOPHASE_INFLUX_DB": str(influx.database),
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": str(REPO),
    }


ENTRY_POINTS = {
    "twophase": [str(JOB)],
    "direct": ["-m", "bench.spark_direct"],
    "twophase_noop_dead_letters": ["-m", "bench.spark_direct", "--stats-sink", "twophase"],
}


def run_job(ctx: Context, side: str, input_dir: Path, work: Path) -> dict[str, Any]:
    """One job run; its stats-query PROGRESS records."""
    name = f"{side}-{uuid.uuid4().hex[:8]}"
    entry_point = ENTRY_POINTS[side]
    cmd = [
        sys.executable, *entry_point,
        "--input", str(input_dir),
        "--checkpoint", str(work / name),
        "--sink-id", f"bench-spark-{name}",
        "--max-files-per-trigger", str(FILES_PER_TRIGGER),
        "--master", MASTER,
        "--conf", "spark.ui.enabled=false",
        "--available-now",
    ]  # fmt: skip
    done = subprocess.run(
        cmd, cwd=REPO, env=job_env(ctx, f"spark_{side.split('_')[0]}"), capture_output=True,
        text=True,
        timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise BenchError(f"{side} Spark job failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return {"progress": _progress(done.stdout, "stats")}


def _progress(stdout: str, query: str) -> list[dict[str, Any]]:
    records = [
        json.loads(x.split(" ", 1)[1]) for x in stdout.splitlines() if x.startswith("PROGRESS ")
    ]
    return [r for r in records if r.get("query") == query and r.get("input_rows")]


def rows_per_s(progress: list[dict[str, Any]]) -> float:
    steady = [r for r in progress if r["batch"] > 0] or progress
    rows = sum(r["input_rows"] for r in steady)
    return rows / (sum(r["duration_ms"] for r in steady) / 1000)


def measure_spark(ctx: Context) -> dict[str, Any]:
    """Metric 6: input rows/s and batch duration, twophase sink vs direct foreachBatch."""
    reason = missing()
    if reason is not None:
        return skipped(f"not available yet: {reason}")
    repeats = ctx.plan.spark_repeats or 1
    with tempfile.TemporaryDirectory(prefix="twophase-bench-spark-") as tmp:
        work = Path(tmp)
        generate_input(work / "input")
        batches: dict[str, list[float]] = {name: [] for name in ENTRY_POINTS}
        add_batch: dict[str, list[float]] = {name: [] for name in ENTRY_POINTS}

        def side(name: str) -> Any:
            def one(repeat: int) -> float:
                ctx.log(f"spark: {name} job, repeat {repeat + 1}/{repeats}")
                progress = run_job(ctx, name, work / "input", work)["progress"]
                batches[name] += [r["duration_ms"] for r in progress if r["batch"] > 0]
                add_batch[name] += [r["commit_ms"] for r in progress if r["batch"] > 0]
                return rows_per_s(progress)

            return one

        rates = rotated(repeats, {name: side(name) for name in ENTRY_POINTS})
    tp, dr = rates["twophase"], rates["direct"]
    diagnostic = rates["twophase_noop_dead_letters"]
    return at_least_direct(
        "input rows/s",
        tp,
        dr,
        TARGET,
        diagnostic={
            "twophase_noop_dead_letters": Summary.of(diagnostic).as_dict(1),
            "ratio": round(statistics.median(diagnostic) / statistics.median(dr), 3),
            "what": "the job with the twophase stats sink but the dead-letter query on noop",
        },
        batch_ms={k: Summary.of(v).as_dict(1) for k, v in batches.items() if v},
        add_batch_ms={k: Summary.of(v).as_dict(1) for k, v in add_batch.items() if v},
        input={"files": FILES, "events_per_file": EVENTS_PER_FILE,
               "files_per_trigger": FILES_PER_TRIGGER, "master": MASTER},
    )  # fmt: skip
