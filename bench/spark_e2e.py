"""Metric 6: the session-metrics job end to end in Spark, against the pipeline users write.

Three sides read the same generated input (``jobs/generate_events.py``, 5,000
events per file) with the same settings (``local[2,4]``, available-now):

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

import os
import statistics
import tempfile
import uuid
from pathlib import Path
from typing import Any

from bench.context import MAIN, Context
from bench.servers import REPO
from bench.spark_runs import MASTER, Run, job_command, job_env, missing, rotated_runs, run_job
from bench.stats import Summary, entry, skipped

JOB = REPO / "jobs" / "session_metrics.py"
EVENTS_PER_FILE = 5000
TRIGGERS = {1: 20, 10: 100}  # files per trigger -> files read (20 and 10 micro-batches)
STEADY_AFTER = 5  # batches 0-4 carry start-up, JIT warm-up and the first state
MIN_REPEATS = 3
SIDES = {
    "job": [str(JOB)],
    "plain": ["-m", "bench.spark_plain"],
    "sink_only": ["-m", "bench.spark_plain", "--sink", "twophase"],
}
# Throughput at least this share of the plain pipeline's, per files per trigger.
JOB_TARGET = {1: 0.9, 10: 0.95}
SINK_ONLY_TARGET = 0.95
FIRST_BATCH_SLACK_S = 2.0


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


def run_spark_job(ctx: Context, side: str, input_dir: Path, per_trigger: int, work: Path) -> Run:
    """One run of a side, timed from process start."""
    name = f"{side}-{per_trigger}-{uuid.uuid4().hex[:8]}"
    cmd = job_command(SIDES[side], input_dir, work / name, f"bench-spark-{name}", per_trigger)
    env = job_env(ctx.scratch.staging_url(MAIN), ctx.scratch.influx(f"spark_{side}"))
    return run_job(cmd, env, work / f"{name}.stderr", side, STEADY_AFTER)


def measure_spark(ctx: Context) -> dict[str, Any]:
    """Metric 6: wall, steady batch and first-batch times of the three sides."""
    reason = missing(JOB)
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
    def run(side: str, repeat: int) -> Run:
        ctx.log(f"spark: {side}, {per_trigger} file(s)/trigger, {repeat + 1}/{repeats}")
        return run_spark_job(ctx, side, input_dir, per_trigger, work)

    return rotated_runs(SIDES, repeats, run)


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
