"""Measured prototypes of core changes (``bench/prototypes.py``) against the core and direct.

For each epoch size, every variant runs the same lines, rotated A B C D...,
B C D A..., each into its own InfluxDB database (so none overwrites another's
points), and is compared with the direct write, the metric-1 baseline:

* ``core``: the Stager + Committer (the metric-1 twophase side): chunks of
  5,000 lines, one request per chunk;
* ``chunk_1k``: chunks of 1,000 lines, five coalesced into one request;
* ``chunk_20k``: chunks of 20,000 lines and requests of 20,000 points.

and, with ``PipelinedCommitter``, the core promoting epoch N in the background
while N+1 stages.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from bench.children import decide_epochs, direct_child, promote_child
from bench.context import MAIN, Context
from bench.cpu import CpuMeter
from bench.lines import epoch_lines
from bench.prototypes import PipelinedCommitter
from bench.servers import admin_conninfo
from bench.sides import BenchError, DirectSide, TwoPhaseSide
from bench.stats import Summary, rotated
from twophase.committer import Committer, Promoter
from twophase.runtime import TwoPhase
from twophase.sender import BatchSender, RetryPolicy
from twophase.staging import Stager


class Built(NamedTuple):
    """A variant's parts over one TwoPhase."""

    committer: Committer
    stager: Stager
    promoter: Promoter


Variant = Callable[[TwoPhase], Built]


def _core(tp: TwoPhase) -> Built:
    return Built(tp.committer, tp.stager, tp.promoter)


def _chunks(lines: int) -> Variant:
    """Chunks of ``lines`` lines; requests of max(lines, the configured batch) points."""

    def make(tp: TwoPhase) -> Built:
        influx = tp.config.influx
        points = max(lines, influx.batch_points)
        sender = BatchSender(
            tp.writer,
            RetryPolicy.from_config(influx),
            max_points=points,
            max_bytes=influx.batch_bytes,
        )
        promoter = Promoter(tp.ledger, tp.reader, sender, points, influx.batch_bytes)
        stager = Stager(tp.db, chunk_points=lines, chunk_chars=influx.batch_bytes)
        return Built(Committer(tp.ledger, promoter, stager), stager, promoter)

    return make


VARIANTS: dict[str, Variant] = {
    "core": _core,
    "chunk_1k": _chunks(1000),
    "chunk_20k": _chunks(20_000),
}


class Variants:
    """One TwoPhase (own InfluxDB database) and one side per variant, plus direct."""

    def __init__(self, ctx: Context) -> None:
        self.meter = CpuMeter(admin_conninfo(ctx.scratch.servers.staging_url), ctx.scratch.prefix)
        self.parts: list[TwoPhase] = []
        self.sides: dict[str, Any] = {"direct": DirectSide(ctx.scratch.influx("x_direct"))}
        self.built: dict[str, Built] = {}
        for name, make in VARIANTS.items():
            tp = TwoPhase.open(ctx.scratch.config(MAIN, f"x_{name}"))
            self.parts.append(tp)
            built = self.built[name] = make(tp)
            self.sides[name] = TwoPhaseSide(tp, f"bench-x-{name}", 0, built.committer, built.stager)

    def close(self) -> None:
        self.sides["direct"].close()
        for tp in self.parts:
            tp.close()


def epoch_experiment(ctx: Context, variants: Variants, size: int) -> dict[str, Any]:
    repeats = ctx.plan.experiment_repeats
    ctx.log(f"experiments: {size:,}-point epochs, {len(variants.sides)} variants x {repeats}")
    seeds = [ctx.seeds.take() for _ in range(repeats)]
    for side in variants.sides.values():
        if isinstance(side, TwoPhaseSide):
            side.phases.stage.clear()
            side.phases.commit.clear()
    cache: dict[int, list[str]] = {}

    def lines(r: int) -> list[str]:
        if r not in cache:
            cache.clear()
            cache[r] = epoch_lines(size, seeds[r])
        return cache[r]

    cpu: dict[str, list[dict[str, float]]] = {name: [] for name in variants.sides}

    def runner(name: str, side: Any) -> Callable[[int], float]:
        def one(r: int) -> float:
            chunk = lines(r)
            with variants.meter.measure(cpu[name]):
                return size / side.run(chunk)

        return one

    rates = rotated(repeats, {name: runner(name, side) for name, side in variants.sides.items()})
    direct = statistics.median(rates["direct"])
    return {
        "unit": "points/s",
        "points": size,
        "sides": {name: Summary.of(v).as_dict() for name, v in rates.items()},
        "ratio_vs_direct": {n: round(statistics.median(v) / direct, 3) for n, v in rates.items()},
        "phases_s": {name: _phases(side) for name, side in variants.sides.items()
                     if isinstance(side, TwoPhaseSide)},
        "cpu_s": {name: _median_cpu(samples) for name, samples in cpu.items()},
    }  # fmt: skip


def _median_cpu(samples: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(statistics.median(s[k] for s in samples), 3) for k in samples[0]}


def _phases(side: TwoPhaseSide) -> dict[str, float]:
    return {
        "stage_median": round(statistics.median(side.phases.stage), 4),
        "commit_median": round(statistics.median(side.phases.commit), 4),
    }


PIPELINED = ("core",)
PIPELINE_EPOCHS = 5


class PipelinedSide:
    """Runs a sequence of epochs, promoting each in the background while the next stages."""

    def __init__(self, side: TwoPhaseSide, built: Built, name: str) -> None:
        tp = side.tp
        self.side = TwoPhaseSide(tp, f"bench-xp-{name}", 0, built.committer, built.stager)
        self.committer = PipelinedCommitter(built.committer, tp.ledger, built.promoter)

    def run(self, epochs: list[list[str]]) -> float:
        side = self.side
        started = time.perf_counter()
        for lines in epochs:
            epoch, side.epoch = side.epoch, side.epoch + 1
            message = side.stager.stage(side.sink_id, epoch, lines)
            self.committer.commit(side.lease, epoch, [message])
        result = self.committer.flush()
        elapsed = time.perf_counter() - started
        if result is None or result.delivered != len(epochs[-1]):
            raise BenchError(f"pipelined epoch {side.epoch - 1} not delivered: {result}")
        return elapsed


def pipelined_experiment(ctx: Context, variants: Variants, size: int) -> dict[str, Any]:
    repeats, count = ctx.plan.experiment_repeats, PIPELINE_EPOCHS
    ctx.log(f"experiments: {count} pipelined {size:,}-point epochs x {repeats}")
    sides = {
        name: PipelinedSide(variants.sides[name], variants.built[name], name) for name in PIPELINED
    }
    seeds = [[ctx.seeds.take() for _ in range(count)] for _ in range(repeats)]
    direct: DirectSide = variants.sides["direct"]

    def run_direct(epochs: list[list[str]]) -> float:
        return sum(direct.run(lines) for lines in epochs)

    runs: dict[str, Callable[[list[list[str]]], float]] = {"direct": run_direct}
    runs.update({f"{name}_pipelined": side.run for name, side in sides.items()})
    cache: dict[int, list[list[str]]] = {}

    def epochs_of(r: int) -> list[list[str]]:
        if r not in cache:
            cache.clear()
            cache[r] = [epoch_lines(size, seed) for seed in seeds[r]]
        return cache[r]

    def runner(run: Callable[[list[list[str]]], float]) -> Callable[[int], float]:
        return lambda r: size * count / run(epochs_of(r))

    rates = rotated(repeats, {name: runner(run) for name, run in runs.items()})
    for side in sides.values():
        side.committer.close()
    base = statistics.median(rates["direct"])
    return {
        "unit": "points/s",
        "points": size,
        "epochs_per_run": count,
        "sides": {name: Summary.of(v).as_dict() for name, v in rates.items()},
        "ratio_vs_direct": {n: round(statistics.median(v) / base, 3) for n, v in rates.items()},
        "phases_s": {},
    }


RECOVERY_VARIANTS = ("core", "chunk_1k", "chunk_20k")


def recovery_experiment(ctx: Context, variants: Variants) -> dict[str, Any]:
    """Metric 5 per promoter: a fresh process promotes N PRECOMMITTED epochs (rotated)."""
    plan = ctx.plan
    points, count, repeats = plan.recovery_points, plan.recovery_epochs, plan.experiment_repeats
    ctx.log(f"experiments: recovery of {count} x {points:,} points per variant x {repeats}")
    seeds = [[ctx.seeds.take() for _ in range(count)] for _ in range(repeats)]
    parts = dict(zip(VARIANTS, variants.parts, strict=True))

    def promote(name: str) -> Callable[[int], float]:
        def one(r: int) -> float:
            side = variants.sides[name]
            sink = f"bench-xr-{name}"
            decide_epochs(parts[name], sink, points, seeds[r], side.stager)
            result = promote_child(ctx, sink, f"x_{name}", name)
            return float(result["points"]) / float(result["seconds"])

        return one

    def direct(r: int) -> float:
        result = direct_child(ctx, points, seeds[r], False, "x_direct")
        return float(result["points"]) / float(result["seconds"])

    runs = {"direct": direct, **{name: promote(name) for name in RECOVERY_VARIANTS}}
    rates = rotated(repeats, runs)
    base = statistics.median(rates["direct"])
    return {
        "unit": "points/s",
        "points": points * count,
        "epochs": count,
        "sides": {name: Summary.of(v).as_dict() for name, v in rates.items()},
        "ratio_vs_direct": {n: round(statistics.median(v) / base, 3) for n, v in rates.items()},
        "phases_s": {},
    }


def measure_all(ctx: Context) -> dict[str, Any]:
    variants = Variants(ctx)
    try:
        warm = epoch_lines(10_000, ctx.seeds.take())
        for side in variants.sides.values():
            side.run(warm)
        found = {
            f"epoch_{size}": epoch_experiment(ctx, variants, size)
            for size in ctx.plan.experiment_sizes or (100_000,)
        }
        found["pipelined_100000"] = pipelined_experiment(ctx, variants, 100_000)
        found["recovery"] = recovery_experiment(ctx, variants)
        return found
    finally:
        variants.close()
