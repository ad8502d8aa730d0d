"""Metrics 4 (memory of the promoting process), 5 (recovery by a fresh process) and 11
(memory of a staging task).

The bench process stages and decides epochs (PRECOMMITTED, not promoted);
then a fresh child process (``bench.child``) promotes them, as a restarted
driver would, and reports its time and peak RSS. The direct side is a fresh
child too, sending the same lines. Metric 11's children stage one task's
lines from a generator, as an executor does, with the default spool bound
and with none.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import uuid
from collections.abc import Callable
from typing import Any

from bench.context import DIRECT_INFLUX, MAIN, TP_INFLUX, Context
from bench.lines import iter_lines
from bench.servers import REPO
from bench.sides import QUERY_ID, BenchError
from bench.stats import Summary, at_least_direct, entry, interleaved
from twophase.config.settings import default
from twophase.protocol.commit.runtime import TwoPhase
from twophase.protocol.stage.stager import Stager

MEMORY_TARGET_MB = 50.0
RECOVERY_TARGET = 0.8
# Metric 11: a staging task may hold its spool's bound in memory, and this much more
# than the same task with a spool of none (allocator slack, a block being converted).
STAGE_SLACK_MB = 16.0


def run_child(*args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "bench.child", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise BenchError(f"bench.child {args[0]} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def decide_epochs(
    tp: TwoPhase, sink: str, points: int, seeds: list[int], stager: Stager | None = None
) -> None:
    """Stage and decide one epoch per seed on ``sink``, leaving them PRECOMMITTED."""
    stager = stager or tp.stager
    lease = tp.begin_run(sink, uuid.uuid4().hex, QUERY_ID)
    first = _next_epoch(tp, sink)
    for offset, seed in enumerate(seeds):
        message = stager.stage(sink, first + offset, iter_lines(points, seed))
        tp.ledger.decide(lease, first + offset, [message])


def _next_epoch(tp: TwoPhase, sink: str) -> int:
    with tp.db.transaction() as cur:
        cur.execute("SELECT last_decided_epoch FROM twophase_sinks WHERE sink_id = %s", (sink,))
        row = cur.fetchone()
    return 0 if row is None or row[0] is None else int(row[0]) + 1


def promote_child(ctx: Context, sink: str, influx_role: str = TP_INFLUX) -> dict[str, Any]:
    influx = ctx.scratch.influx(influx_role)
    return run_child(
        "promote",
        "--staging-url",
        ctx.scratch.staging_url(MAIN),
        "--influx-url",
        influx.url,
        "--influx-db",
        str(influx.influxdb.database),
        "--sink",
        sink,
    )


def direct_child(
    ctx: Context, points: int, seeds: list[int], stream: bool, influx_role: str = DIRECT_INFLUX
) -> dict[str, Any]:
    influx = ctx.scratch.influx(influx_role)
    args = ["direct", "--influx-url", influx.url, "--influx-db", str(influx.influxdb.database)]
    args += ["--points", str(points), "--seeds", ",".join(map(str, seeds))]
    return run_child(*args, *(["--stream"] if stream else []))


class Runs:
    """Both sides' child results of one metric, repeat by repeat (seeds shared per repeat)."""

    def __init__(self, ctx: Context, points: int, epochs: int, sink: str, stream: bool) -> None:
        self.ctx, self.points, self.epochs, self.sink, self.stream = (
            ctx,
            points,
            epochs,
            sink,
            stream,
        )
        self.seeds: dict[int, list[int]] = {}
        self.results: dict[str, list[dict[str, Any]]] = {"twophase": [], "direct": []}

    def seeds_of(self, repeat: int) -> list[int]:
        if repeat not in self.seeds:
            self.seeds[repeat] = [self.ctx.seeds.take() for _ in range(self.epochs)]
        return self.seeds[repeat]

    def twophase(self, value: Callable[[dict[str, Any]], float]) -> Callable[[int], float]:
        def one(repeat: int) -> float:
            decide_epochs(self.ctx.tp(), self.sink, self.points, self.seeds_of(repeat))
            result = promote_child(self.ctx, self.sink)
            if result["points"] != self.points * self.epochs:
                raise BenchError(f"recovery promoted {result['points']} points")
            self.results["twophase"].append(result)
            return value(result)

        return one

    def direct(self, value: Callable[[dict[str, Any]], float]) -> Callable[[int], float]:
        def one(repeat: int) -> float:
            result = direct_child(self.ctx, self.points, self.seeds_of(repeat), self.stream)
            self.results["direct"].append(result)
            return value(result)

        return one


def _growth(result: dict[str, Any]) -> float:
    return float(result["growth_mb"])


def _rate(result: dict[str, Any]) -> float:
    return float(result["points"]) / float(result["seconds"])


def memory_at(ctx: Context, points: int) -> dict[str, Any]:
    runs = Runs(ctx, points, 1, f"bench-memory-{points}", stream=True)
    repeats = ctx.plan.memory_repeats
    tp, dr = interleaved(repeats, runs.twophase(_growth), runs.direct(_growth))
    median = statistics.median(tp)
    return entry(
        "MB peak RSS growth",
        {"twophase": Summary.of(tp), "direct": Summary.of(dr)},
        median / max(statistics.median(dr), 0.1),
        "twophase / direct (medians; direct streams its lines in batches)",
        f"< {MEMORY_TARGET_MB:g} MB growth of the promoting process",
        median < MEMORY_TARGET_MB,
        points=points,
        peak_reset=all(r["peak_reset"] for r in runs.results["twophase"]),
        rss_before_mb=round(runs.results["twophase"][0]["rss_before_mb"], 1),
    )


def measure_memory(ctx: Context) -> dict[str, Any]:
    """Metric 4: peak RSS growth of a process promoting one epoch, per epoch size."""
    by_size: dict[str, Any] = {}
    for points in ctx.plan.memory_sizes:
        ctx.log(
            f"memory: promoting a {points:,}-point epoch in a child x {ctx.plan.memory_repeats}"
        )
        by_size[str(points)] = memory_at(ctx, points)
    worst = max(by_size.values(), key=lambda e: e["sides"]["twophase"]["median"])
    return {**worst, "holds": all(e["holds"] for e in by_size.values()), "by_size": by_size}


def measure_recovery(ctx: Context) -> dict[str, Any]:
    """Metric 5: points/s of a fresh process promoting N PRECOMMITTED epochs, vs direct."""
    plan = ctx.plan
    points, epochs = plan.recovery_points, plan.recovery_epochs
    ctx.log(f"recovery: {epochs} epochs x {points:,} points x {plan.recovery_repeats}")
    runs = Runs(ctx, points, epochs, "bench-recovery", stream=False)
    tp, dr = interleaved(plan.recovery_repeats, runs.twophase(_rate), runs.direct(_rate))
    return at_least_direct(
        "points/s",
        tp,
        dr,
        RECOVERY_TARGET,
        epochs=epochs,
        points_per_epoch=points,
        peak_growth_mb=round(max(r["growth_mb"] for r in runs.results["twophase"]), 1),
        open_s={
            k: round(statistics.median(r["open_s"] for r in v), 3) for k, v in runs.results.items()
        },
    )


def stage_child(ctx: Context, points: int, spool_memory: int) -> dict[str, Any]:
    """A fresh child stages ``points`` lines of a new seed as one write; its result."""
    result = run_child(
        "stage",
        "--staging-url",
        ctx.scratch.staging_url(MAIN),
        "--sink",
        "bench-stage-memory",
        "--points",
        str(points),
        "--seeds",
        str(ctx.seeds.take()),
        "--spool-memory",
        str(spool_memory),
    )
    if result["points"] != points:
        raise BenchError(f"staging staged {result['points']} of {points} points")
    return result


def measure_stage_memory(ctx: Context) -> dict[str, Any]:
    """Metric 11: peak RSS growth of a process staging one task's points from a generator,
    with the default ``staging_spool_memory`` against a spool that keeps nothing in memory
    (every chunk to its file: the memory of a stager without a spool's memory part)."""
    points, repeats = ctx.plan.stage_memory
    bound = int(default("staging_spool_memory"))
    ctx.log(f"stage memory: staging {points:,} points in a child x {repeats} per side")
    results: dict[str, list[dict[str, Any]]] = {"default_bound": [], "file_only": []}

    def side(name: str, spool_memory: int) -> Callable[[int], float]:
        def one(repeat: int) -> float:
            result = stage_child(ctx, points, spool_memory)
            results[name].append(result)
            return float(result["growth_mb"])

        return one

    spooled, file_only = interleaved(repeats, side("default_bound", bound), side("file_only", 0))
    over = statistics.median(spooled) - statistics.median(file_only)
    bound_mb = bound / 2**20
    return entry(
        "MB peak RSS growth",
        {"default_bound": Summary.of(spooled), "file_only": Summary.of(file_only)},
        statistics.median(spooled) / max(statistics.median(file_only), 0.1),
        "default bound / file only (medians)",
        f"<= the bound ({bound_mb:g} MiB) + {STAGE_SLACK_MB:g} MB over file only",
        over <= bound_mb + STAGE_SLACK_MB,
        points=points,
        spool_memory_bytes=bound,
        over_file_only_mb=round(over, 1),
        seconds={
            name: round(statistics.median(r["seconds"] for r in runs), 3)
            for name, runs in results.items()
        },
        peak_reset=all(r["peak_reset"] for runs in results.values() for r in runs),
    )
