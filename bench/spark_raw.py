"""Metric 9: Spark with many points per micro-batch, one point per event.

Metric 6 writes a few hundred aggregated points per micro-batch; a raw
quality-of-service stream writes one point per event, hundreds of thousands
per micro-batch, where promotion is most of the batch. Three sides run
``bench/spark_raw_job.py`` on the same generated events
(``jobs/generate_events.py``, no malformed lines), with the same point shape
(``qos_raw``, tags stream, ISP and user, two integer fields, the event's time)
and the same settings (``local[2,4]``, available-now, ``Plan.spark_raw``: events
per file, files per trigger, micro-batches):

- ``background``: ``twophase.spark.foreach_batch_writer`` with
  ``promotion="background"``;
- ``inline``: the same with ``promotion="inline"`` (reported);
- ``plain``: the at-least-once ``foreachBatch`` users write without twophase
  (``foreachPartition`` POSTs f-string line protocol, 5,000 lines a request).

Each run is one process, timed from its start (``bench.spark_runs``), with
its own InfluxDB database and staging database, dropped after the run once
InfluxDB was checked to hold every point (events sharing series and
millisecond collapse into one point in InfluxDB on every side alike; the
expected count is computed from the files). Per side: wall time, the
steady-state batch time (median ``triggerExecution`` after ``STEADY_AFTER``
warm-up batches) and the steady points per second. Sides rotate per repeat;
medians; target: background at least 1.0x plain.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.context import Context
from bench.sides import BenchError
from bench.spark_raw_job import FIELDS, MEASUREMENT, QUERY, TAGS
from bench.spark_runs import MASTER, Run, job_command, job_env, missing, rotated_runs, run_job
from bench.stats import Summary, entry, skipped
from twophase.influx.query import query_v1

ENTRY = ["-m", "bench.spark_raw_job"]
SIDES = {
    "background": ["--sink", "twophase", "--promotion", "background"],
    "inline": ["--sink", "twophase", "--promotion", "inline"],
    "plain": ["--sink", "plain"],
}
TARGET = {"background": 1.0, "inline": None}  # at least this share of plain's throughput
STEADY_AFTER = 2  # batch 0 carries start-up and JIT warm-up, batch 1 the rest of it
MIN_REPEATS = 3
COUNT = f"SELECT count({FIELDS[0]}) FROM {MEASUREMENT}"  # noqa: S608 (constants)


def measure_spark_raw(ctx: Context) -> dict[str, Any]:
    """Metric 9: wall, steady batch time and points/s of the three sides."""
    reason = missing()
    if reason is not None:
        return skipped(f"not available yet: {reason}")
    per_file, per_trigger, batches = ctx.plan.spark_raw
    repeats = max(MIN_REPEATS, ctx.plan.spark_repeats)
    with tempfile.TemporaryDirectory(prefix="twophase-bench-raw-") as tmp:
        work = Path(tmp)
        input_dir = generate_input(work / "input", per_file, per_trigger * batches)
        expected = distinct_points(input_dir)
        ctx.log(f"spark_raw: {per_file * per_trigger:,} points/batch, {batches} batches/run")
        runs = _rotate(ctx, repeats, lambda side: _run(ctx, side, input_dir, expected, work))
    parts = {
        f"{side} {what}": item
        for side in TARGET
        for what, item in _entries(side, runs, per_file * per_trigger).items()
    }
    headline = parts["background points/s"]
    return {
        **headline,
        "holds": all(p["holds"] for p in parts.values() if p["holds"] is not None),
        "parts": parts,
        "input": {
            "events_per_file": per_file,
            "files_per_trigger": per_trigger,
            "points_per_batch": per_file * per_trigger,
            "batches": batches,
            "points_in_influx": expected,
            "master": MASTER,
            "repeats": repeats,
            "steady_after_batch": STEADY_AFTER,
        },
    }


def generate_input(folder: Path, events_per_file: int, files: int) -> Path:
    from jobs.generate_events import generate

    generate(folder, files=files, events_per_file=events_per_file, malformed_every=0)
    return folder


def distinct_points(folder: Path) -> int:
    """The points InfluxDB must hold: one per distinct series and millisecond."""
    keys = set()
    for path in sorted(folder.glob("*.jsonl")):
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                event = json.loads(line)
                keys.add((*(event[t] for t in TAGS), round(event["timestamp"] * 1000)))
    return len(keys)


def _run(ctx: Context, side: str, input_dir: Path, expected: int, work: Path) -> Run:
    """One run of ``side`` into databases of its own; checks InfluxDB, then drops them."""
    name = f"raw_{side}_{uuid.uuid4().hex[:8]}"
    influx = ctx.scratch.influx(name)
    try:
        staging = None if side == "plain" else ctx.scratch.staging_url(name)
        cmd = [
            *job_command(ENTRY, input_dir, work / name, f"bench-{name}", ctx.plan.spark_raw[1]),
            *SIDES[side],
        ]
        env = job_env(staging, influx)
        run = run_job(cmd, env, work / f"{name}.stderr", side, STEADY_AFTER, QUERY)
        got = _count(influx.url, str(influx.database))
        if got != expected:
            raise BenchError(f"{side}: InfluxDB holds {got} points, expected {expected}")
        return run
    finally:
        ctx.scratch.drop(name)


def _count(url: str, database: str) -> int:
    series = query_v1(url, database, COUNT, timeout_s=120)
    return int(series[0]["values"][0][1]) if series else 0


def _rotate(ctx: Context, repeats: int, run: Callable[[str], Run]) -> dict[str, list[Run]]:
    def logged(side: str, repeat: int) -> Run:
        ctx.log(f"spark_raw: {side}, {repeat + 1}/{repeats}")
        return run(side)

    return rotated_runs(SIDES, repeats, logged)


def _entries(side: str, runs: dict[str, list[Run]], per_batch: int) -> dict[str, Any]:
    """``side``'s rows against plain: steady points/s, wall time, steady batch time."""
    target = TARGET[side]
    out: dict[str, Any] = {}
    for what, unit, attr in (
        ("points/s", "points/s", "steady_rows_per_s"),
        ("wall", "s", "wall_s"),
        ("steady batch", "ms", "steady_ms"),
    ):
        mine = [getattr(r, attr) for r in runs[side]]
        theirs = [getattr(r, attr) for r in runs["plain"]]
        rate = unit == "points/s"
        ratio = (
            statistics.median(mine) / statistics.median(theirs)
            if rate
            else statistics.median(theirs) / statistics.median(mine)
        )
        out[what] = entry(
            unit,
            {side: Summary.of(mine), "plain": Summary.of(theirs)},
            ratio,
            f"{side} / plain (medians)" if rate else "plain / side (median times: a throughput)",
            "none (reported)" if target is None else f">= {target}x plain",
            None if target is None else ratio >= target,
            points_per_batch=per_batch,
        )
    return out
