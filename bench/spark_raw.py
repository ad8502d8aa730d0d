"""Metric 9: Spark with many points per micro-batch, one point per event, over a slow link.

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
- ``inline``: the same with ``promotion="inline"``;
- ``plain``: the at-least-once ``foreachBatch`` users write without twophase
  (``foreachPartition`` POSTs f-string line protocol, 5,000 lines a request).

The link to InfluxDB is a setting (:class:`bench.spark_runs.Link`): by
default the slow one, InfluxDB in another region (every answer held 20 ms,
100 Mbit/s each way shared by all of a job's connections: the test kit's
proxy in a process of its own); loopback as before on request. PostgreSQL
stays local on both, as beside the Spark driver.

Each run is one process, timed from its start (``bench.spark_runs``), with
its own InfluxDB database and staging database, dropped after the run once
InfluxDB was checked to hold every point (events sharing series and
millisecond collapse into one point in InfluxDB on every side alike; the
expected count is computed from the files). Per side: wall time, the
steady-state batch time (median ``triggerExecution`` after ``STEADY_AFTER``
warm-up batches) and the steady points per second. Sides rotate per repeat;
medians. Target, per link: the better twophase mode (higher median steady
points/s, named in the results) at least 1.0x plain; the other is reported.

``python -m bench spark_raw [--link loopback|slow ...]`` runs the metric alone
(both links: ``--link loopback --link slow``) and prints its results.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.context import Context, run_alone
from bench.plan import FULL, QUICK
from bench.report import best_of
from bench.sides import BenchError
from bench.spark_raw_job import FIELDS, MEASUREMENT, QUERY, TAGS
from bench.spark_runs import (
    LINKS,
    MASTER,
    SLOW_LINK,
    Link,
    Run,
    compression,
    job_command,
    job_env,
    missing,
    reached,
    rotated_runs,
    run_job,
)
from bench.stats import Summary, entry, skipped
from twophase.influx.query import query_v1

ENTRY = ["-m", "bench.spark_raw_job"]
SIDES = {
    "background": ["--sink", "twophase", "--promotion", "background"],
    "inline": ["--sink", "twophase", "--promotion", "inline"],
    "plain": ["--sink", "plain"],
}
MODES = ("background", "inline")  # twophase's sides; the better one carries the target
TARGET = 1.0  # the better mode's steady points/s, at least this share of plain's
STEADY_AFTER = 2  # batch 0 carries start-up and JIT warm-up, batch 1 the rest of it
MIN_REPEATS = 3
COUNT = f"SELECT count({FIELDS[0]}) FROM {MEASUREMENT}"  # noqa: S608 (constants)
WHATS = (  # (part, unit, Run attribute)
    ("points/s", "points/s", "steady_rows_per_s"),
    ("wall", "s", "wall_s"),
    ("steady batch", "ms", "steady_ms"),
)


def measure_spark_raw(
    ctx: Context, links: Sequence[Link] = (SLOW_LINK,), repeats: int | None = None
) -> dict[str, Any]:
    """Metric 9: wall, steady batch time and points/s of the three sides, per link;
    ``repeats`` (default: the plan's, at least ``MIN_REPEATS``) runs per side and link."""
    reason = missing()
    if reason is not None:
        return skipped(f"not available yet: {reason}")
    per_file, per_trigger, batches = ctx.plan.spark_raw
    repeats = repeats or max(MIN_REPEATS, ctx.plan.spark_repeats)
    runs: dict[str, dict[str, list[Run]]] = {}
    with tempfile.TemporaryDirectory(prefix="twophase-bench-raw-") as tmp:
        work = Path(tmp)
        input_dir = generate_input(work / "input", per_file, per_trigger * batches)
        expected = distinct_points(input_dir)
        ctx.log(f"spark_raw: {per_file * per_trigger:,} points/batch, {batches} batches/run")
        for link in links:
            runs[link.key] = _rotate(ctx, repeats, link, _runner(ctx, link, input_dir, expected))
    best = {link.key: _best(runs[link.key]) for link in links}
    parts = {
        f"{link.key} {side} {what}": item
        for link in links
        for side in MODES
        for what, item in _entries(
            side, runs[link.key], per_file * per_trigger, side == best[link.key], link
        ).items()
    }
    return {
        **best_of(parts, f"{links[0].key} {best[links[0].key]} points/s", best),
        "input": {
            "events_per_file": per_file,
            "files_per_trigger": per_trigger,
            "points_per_batch": per_file * per_trigger,
            "batches": batches,
            "points_in_influx": expected,
            "master": MASTER,
            "repeats": repeats,
            "steady_after_batch": STEADY_AFTER,
            "links": [link.as_dict() for link in links],
            "compression": compression(),
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


def _runner(ctx: Context, link: Link, input_dir: Path, expected: int) -> Callable[[str], Run]:
    return lambda side: _run(ctx, side, link, input_dir, expected)


def _run(ctx: Context, side: str, link: Link, input_dir: Path, expected: int) -> Run:
    """One run of ``side`` over ``link`` into databases of its own; checks InfluxDB
    (over loopback: the check is no part of the run), then drops them."""
    name = f"raw_{side}_{uuid.uuid4().hex[:8]}"
    influx = ctx.scratch.influx(name)
    work = input_dir.parent
    try:
        staging = None if side == "plain" else ctx.scratch.staging_url(name)
        cmd = [
            *job_command(ENTRY, input_dir, work / name, f"bench-{name}", ctx.plan.spark_raw[1]),
            *SIDES[side],
        ]
        with reached(link, influx.url) as url:
            env = job_env(staging, dataclasses.replace(influx, url=url))
            run = run_job(cmd, env, work / f"{name}.stderr", side, STEADY_AFTER, QUERY)
        got = _count(influx.url, str(influx.influxdb.database))
        if got != expected:
            raise BenchError(f"{side}: InfluxDB holds {got} points, expected {expected}")
        return run
    finally:
        ctx.scratch.drop(name)


def _count(url: str, database: str) -> int:
    series = query_v1(url, database, COUNT, timeout_s=120)
    return int(series[0]["values"][0][1]) if series else 0


def _rotate(
    ctx: Context, repeats: int, link: Link, run: Callable[[str], Run]
) -> dict[str, list[Run]]:
    def logged(side: str, repeat: int) -> Run:
        ctx.log(f"spark_raw ({link.key} link): {side}, {repeat + 1}/{repeats}")
        return run(side)

    return rotated_runs(SIDES, repeats, logged)


def _best(runs: dict[str, list[Run]]) -> str:
    """The twophase mode with the higher median steady points/s."""
    return max(MODES, key=lambda mode: statistics.median(r.steady_rows_per_s for r in runs[mode]))


def _entries(
    side: str, runs: dict[str, list[Run]], per_batch: int, best: bool, link: Link
) -> dict[str, Any]:
    """``side``'s rows against plain: steady points/s, wall time, steady batch time;
    held to the target when ``side`` is the better mode, else reported."""
    target = TARGET if best else None
    out: dict[str, Any] = {}
    for what, unit, attr in WHATS:
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
            "none (reported)" if target is None else f">= {target}x plain (the better mode)",
            None if target is None else ratio >= target,
            points_per_batch=per_batch,
            best_mode=best,
            **link.as_dict(),
        )
    return out


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench spark_raw", description=__doc__)
    ap.add_argument(
        "--link",
        action="append",
        choices=list(LINKS),
        help="the link(s) to InfluxDB, in order (default: slow)",
    )
    ap.add_argument("--repeats", type=int, default=None, help=f"default {MIN_REPEATS}")
    ap.add_argument(
        "--size",
        type=int,
        nargs=3,
        default=None,
        metavar=("EVENTS_PER_FILE", "FILES_PER_TRIGGER", "BATCHES"),
        help="instead of the full plan's (a smoke run)",
    )
    return ap.parse_args(argv)


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    plan = FULL if args.size is None else dataclasses.replace(QUICK, spark_raw=tuple(args.size))
    links = [LINKS[key] for key in args.link or [SLOW_LINK.key]]
    return run_alone(plan, lambda ctx: measure_spark_raw(ctx, links, args.repeats))
