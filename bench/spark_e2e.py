"""Metric 6: the session-metrics job end to end in Spark, against the pipeline users write.

Three sides read the same generated input (``jobs/generate_events.py``, 5,000
events per file) with the same settings (``local[2]``, available-now):

- ``job``: ``jobs/session_metrics.py`` as shipped (staged points, dead
  letters split off, exactly once);
- ``plain``: ``bench/spark_plain.py``, what a data engineer writes instead,
  written without twophase's or the job's code (JSON source with a schema,
  malformed lines dropped, ``foreachPartition`` POSTs to InfluxDB);
- ``sink_only``: the plain pipeline with ``twophase.spark.foreach_batch_writer``
  as its sink: separates the sink's cost from the job's.

Each run is one process, timed from its start: wall time until it exits,
time to the first micro-batch (its first ``PROGRESS`` line), and the
steady-state batch time (median ``triggerExecution`` of the batches after
the first five that read input). Twice: 20 files at 1 file per trigger and
100 files at 10 per trigger. Runs rotate side order each repeat (at least
three repeats). Ratios are throughputs, plain's time over the side's time.
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
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.context import MAIN, Context
from bench.servers import REPO
from bench.sides import BenchError
from bench.stats import Summary, entry, rotated, skipped

JOB = REPO / "jobs" / "session_metrics.py"
EVENTS_PER_FILE = 5000
TRIGGERS = {1: 20, 10: 100}  # files per trigger -> files read (20 and 10 micro-batches)
STEADY_AFTER = 5  # batches 0-4 carry start-up, JIT warm-up and the first state
MIN_REPEATS = 3
MASTER = "local[2]"
TIMEOUT_S = 600
SIDES = {
    "job": [str(JOB)],
    "plain": ["-m", "bench.spark_plain"],
    "sink_only": ["-m", "bench.spark_plain", "--sink", "twophase"],
}
# Throughput at least this share of the plain pipeline's, per files per trigger.
JOB_TARGET = {1: 0.9, 10: 0.95}
SINK_ONLY_TARGET = 0.95
FIRST_BATCH_SLACK_S = 2.0


@dataclass(frozen=True)
class Run:
    """One job process: seconds to exit, to the first batch, and the steady batch time."""

    wall_s: float
    first_batch_s: float
    steady_ms: float


def missing() -> str | None:
    """Why metric 6 cannot run here, or None."""
    if not JOB.exists():
        return "jobs/session_metrics.py is missing"
    for module in ("twophase.spark", "pyspark", "pyarrow"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is missing"
    if shutil.which("java") is None:
        return "no java on PATH (scripts/dev.sh setup installs it)"
    return None


def generate_inputs(folder: Path) -> dict[int, Path]:
    """One input folder per files-per-trigger setting; the smaller is a prefix of the larger."""
    from jobs.generate_events import generate

    paths = generate(folder / "all", files=max(TRIGGERS.values()), events_per_file=EVENTS_PER_FILE)
    inputs = {}
    for per_trigger, files in TRIGGERS.items():
        inputs[per_trigger] = folder / f"{files}-files"
        inputs[per_trigger].mkdir()
        for path in paths[:files]:  # hard links keep the order Spark lists them in
            os.link(path, inputs[per_trigger] / path.name)
    return inputs


def job_env(ctx: Context, side: str) -> dict[str, str]:
    influx = ctx.scratch.influx(f"spark_{side}")
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("TWOPHASE_CRASH")},
        "TWOPHASE_STAGING_URL": ctx.scratch.staging_url(MAIN),
        "TWOPHASE_INFLUX_URL": influx.url,
        "TWOPHASE_INFLUX_API": "v1",
        "TWOPHASE_INFLUX_DB": str(influx.database),
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": str(REPO),
    }


def run_job(ctx: Context, side: str, input_dir: Path, per_trigger: int, work: Path) -> Run:
    """One run of a side, timed from process start."""
    name = f"{side}-{per_trigger}-{uuid.uuid4().hex[:8]}"
    cmd = [
        sys.executable, *SIDES[side],
        "--input", str(input_dir),
        "--checkpoint", str(work / name),
        "--sink-id", f"bench-spark-{name}",
        "--max-files-per-trigger", str(per_trigger),
        "--master", MASTER,
        "--conf", "spark.ui.enabled=false",
        "--available-now",
    ]  # fmt: skip
    started = time.monotonic()
    with open(work / f"{name}.stderr", "w+") as err:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=job_env(ctx, side), stdout=subprocess.PIPE, stderr=err, text=True
        )
        batches, first = _follow(proc, started)
        code = proc.wait()
        wall = time.monotonic() - started
        err.seek(0)
        if code != 0 or first is None:
            raise BenchError(f"{side} Spark job failed ({code}):\n{err.read()[-3000:]}")
    steady = [b["duration_ms"] for b in batches if b["batch"] >= STEADY_AFTER and b["input_rows"]]
    if not steady:
        raise BenchError(f"{side}: no batch with input after batch {STEADY_AFTER}")
    return Run(wall, first, statistics.median(steady))


Progress = list[dict[str, Any]]


def _follow(proc: subprocess.Popen[str], started: float) -> tuple[Progress, float | None]:
    """The stats query's PROGRESS records, and the seconds to the first one."""
    assert proc.stdout is not None
    batches: Progress = []
    first = None
    deadline = started + TIMEOUT_S
    for line in proc.stdout:
        if time.monotonic() > deadline:
            proc.kill()
            raise BenchError(f"a Spark job ran over {TIMEOUT_S} s")
        if not line.startswith("PROGRESS "):
            continue
        record = json.loads(line.split(" ", 1)[1])
        if record.get("query") == "stats":
            first = first if first is not None else time.monotonic() - started
            batches.append(record)
    return batches, first


def measure_spark(ctx: Context) -> dict[str, Any]:
    """Metric 6: wall, steady batch and first-batch times of the three sides."""
    reason = missing()
    if reason is not None:
        return skipped(f"not available yet: {reason}")
    repeats = max(MIN_REPEATS, ctx.plan.spark_repeats)
    parts: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="twophase-bench-spark-") as tmp:
        work = Path(tmp)
        inputs = generate_inputs(work / "input")
        for per_trigger, input_dir in inputs.items():
            runs = _rotate(ctx, repeats, per_trigger, input_dir, work)
            parts.update(_entries(per_trigger, runs))
    return {
        "parts": parts,
        "holds": all(p["holds"] for p in parts.values() if p["holds"] is not None),
        "input": {
            "events_per_file": EVENTS_PER_FILE,
            "files": {str(k): v for k, v in TRIGGERS.items()},
            "master": MASTER,
            "repeats": repeats,
            "steady_after_batch": STEADY_AFTER,
        },
    }


def _rotate(
    ctx: Context, repeats: int, per_trigger: int, input_dir: Path, work: Path
) -> dict[str, list[Run]]:
    runs: dict[str, list[Run]] = {side: [] for side in SIDES}

    def side(name: str) -> Any:
        def one(repeat: int) -> float:
            ctx.log(f"spark: {name}, {per_trigger} file(s)/trigger, {repeat + 1}/{repeats}")
            runs[name].append(run_job(ctx, name, input_dir, per_trigger, work))
            return runs[name][-1].wall_s

        return one

    rotated(repeats, {name: side(name) for name in SIDES})
    return runs


def _entries(per_trigger: int, runs: dict[str, list[Run]]) -> dict[str, Any]:
    """The metric's rows for one files-per-trigger setting."""
    label = f"{per_trigger} file{'s' if per_trigger > 1 else ''}/trigger"
    plain = runs["plain"]
    out: dict[str, Any] = {}
    for side, target in (("job", JOB_TARGET[per_trigger]), ("sink_only", SINK_ONLY_TARGET)):
        for what, unit, attr in (("wall", "s", "wall_s"), ("steady batch", "ms", "steady_ms")):
            mine = [getattr(r, attr) for r in runs[side]]
            theirs = [getattr(r, attr) for r in plain]
            ratio = statistics.median(theirs) / statistics.median(mine)
            out[f"{label}, {side} {what}"] = entry(
                unit,
                {side: Summary.of(mine), "plain": Summary.of(theirs)},
                ratio,
                "plain / side (median times: a throughput ratio)",
                f">= {target}x plain",
                ratio >= target,
            )
    first = {side: [r.first_batch_s for r in runs[side]] for side in ("job", "plain")}
    extra = statistics.median(first["job"]) - statistics.median(first["plain"])
    out[f"{label}, job first batch"] = entry(
        "s",
        {side: Summary.of(values) for side, values in first.items()},
        statistics.median(first["plain"]) / statistics.median(first["job"]),
        "plain / job (median times to the first batch)",
        f"<= +{FIRST_BATCH_SLACK_S:g} s over plain",
        extra <= FIRST_BATCH_SLACK_S,
        extra_s=round(extra, 2),
    )
    return out
