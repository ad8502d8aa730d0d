"""``python -m bench costs [--quick] [--out DIR]``: what exactly-once costs, in one run.

One table of ten rows, each a ratio against what a user writes instead, or a CPU
figure per million points, with its target (``bench/README.md``, "What exactly-once
costs"):

1. the README's pipeline on CSV, one point per row, against the plain ``foreachBatch``
   (``bench/costs_job.py``: sinks ``twophase``, ``plain`` and ``noop``, rotated);
2. where each epoch's time goes, both pipelines (profiles of their ``foreachBatch``,
   the plain writer's accumulators, ``bench.steps``);
3. the seeds' job against its plain pipeline, 1 and 10 files a trigger (metric 6);
4. the executors' staging CPU per million points, columnar against the row builder,
   on the CSV pipeline's Arrow batches, in this process;
5. twophase's CPU over the pipeline without a writer against the plain writer's;
6. the driver's CPU per million points promoted (metric 13, ``gzip``);
7. the slow link (metric 10): inline against 4 direct connections with gzip level 1;
8. two targets against one behind 20 ms, on stub servers that only answer;
9. two targets against one on two real influxd (``bench.fanout``'s loopback);
10. loopback throughput at 100k and 1M points against direct (metric 1), against the
    ratios of the run the docs quote.

Writes ``bench/results/costs-<stamp>.json``, ``.md`` and ``.png``; prints the
Markdown. A part that fails is recorded as failed; the others still run.
"""

from __future__ import annotations

import argparse
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import costs_core, costs_report, costs_spark, fanout, report
from bench.context import Context
from bench.plan import FULL, QUICK
from bench.report import RESULTS, machine, stamp
from bench.servers import Servers, scratch


@dataclass(frozen=True)
class CostPlan:
    """How much each part measures."""

    name: str
    csv: tuple[int, int, int]  # rows per file (= per micro-batch), files, repeats per side
    seeds: tuple[tuple[int, ...], int]  # files per trigger, repeats per side
    staging: tuple[int, int]  # rows, repeats per encoder
    steps: tuple[int, int]  # points of the epoch, repeats
    relay: tuple[int, int]  # points per epoch, repeats
    roundtrip: tuple[int, int, int]  # epoch size, epochs in a row, repeats per side
    stub_epochs: int  # per sink
    fanout: fanout.Plan
    throughput: tuple[tuple[int, int], ...]  # (epoch size, repeats per side)


QUICK_PLAN = CostPlan(
    name="quick",
    csv=(25_000, 4, 1),
    seeds=((10,), 1),
    staging=(50_000, 3),
    steps=(100_000, 1),
    relay=(100_000, 1),
    roundtrip=(200_000, 1, 1),
    stub_epochs=6,
    fanout=fanout.Plan("quick", cycles=1, repeats=3),
    throughput=((100_000, 3),),
)
FULL_PLAN = CostPlan(
    name="full",
    csv=(25_000, 12, 3),
    seeds=((1, 10), 3),
    staging=(100_000, 5),
    steps=(300_000, 3),
    relay=(1_000_000, 2),
    roundtrip=(500_000, 1, 3),
    stub_epochs=20,
    fanout=fanout.Plan("costs", cycles=2, repeats=5),
    throughput=((100_000, 5), (1_000_000, 2)),
)


def parts(plan: CostPlan) -> dict[str, Callable[[Context], dict[str, Any]]]:
    """Each part of the run, in order: the Spark ones first, on a quiet machine."""
    return {
        "csv": lambda ctx: costs_spark.measure_csv(ctx, *plan.csv),
        "seeds": lambda ctx: costs_spark.measure_seeds(ctx, *plan.seeds),
        "staging": lambda ctx: costs_core.measure_staging(ctx, *plan.staging),
        "steps": lambda ctx: costs_core.measure_steps(ctx, *plan.steps),
        "relay": lambda ctx: costs_core.measure_relay(ctx, *plan.relay),
        "roundtrip": lambda ctx: costs_core.measure_roundtrip(ctx, plan.roundtrip),
        "fanout_stub": lambda ctx: costs_core.measure_fanout_stub(ctx, plan.stub_epochs),
        "fanout_real": lambda ctx: costs_core.measure_fanout_real(ctx, plan.fanout),
        "throughput": lambda ctx: costs_core.measure_throughput(ctx, plan.throughput),
    }


def run_part(ctx: Context, name: str, part: Callable[[Context], dict[str, Any]]) -> dict[str, Any]:
    """One part, timed; a failure is recorded (with its error) and the run goes on."""
    clock = time.monotonic()
    try:
        return {**part(ctx), "seconds": round(time.monotonic() - clock, 1)}
    except Exception as exc:  # a failed part must not lose the others' figures
        traceback.print_exc()
        return {"failed": f"{type(exc).__name__}: {exc}"}
    finally:
        ctx.log(f"costs: {name} done ({time.monotonic() - clock:.0f} s)")


def run(plan: CostPlan, only: Sequence[str] | None) -> dict[str, Any]:
    started, clock = stamp(), time.monotonic()
    # "costs-quick", not "quick": tests/unit/test_bench_readme.py takes any results file
    # whose plan is "quick" in bench/results for the run docs/performance.md must quote
    results: dict[str, Any] = {
        "started": started,
        "plan": f"costs-{plan.name}",
        "machine": machine(),
    }
    with scratch(Servers.from_env()) as made:
        ctx = Context(QUICK if plan.name == "quick" else FULL, made)
        try:
            results["parts"] = {
                name: run_part(ctx, name, part)
                for name, part in parts(plan).items()
                if not only or name in only
            }
        finally:
            ctx.close()
    results["seconds"] = round(time.monotonic() - clock, 1)
    results["rows"] = costs_report.rows(results["parts"])
    return results


def write(results: dict[str, Any], folder: Path) -> dict[str, Path]:
    base = folder / f"costs-{results['started']}"
    return report.write_files(results, base, costs_report.markdown, costs_report.chart)


def main(argv: Sequence[str]) -> int:
    """``python -m bench costs [--quick] [--out DIR] [--only PART ...]``."""
    ap = argparse.ArgumentParser(prog="python -m bench costs", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="a few minutes, single samples")
    ap.add_argument("--out", type=Path, default=RESULTS, help="default: bench/results")
    ap.add_argument("--only", nargs="+", choices=list(parts(QUICK_PLAN)), help="these parts")
    args = ap.parse_args(argv)
    results = run(QUICK_PLAN if args.quick else FULL_PLAN, args.only)
    return report.finish(costs_report.markdown(results), write(results, args.out))
