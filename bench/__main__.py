"""``python -m bench [--quick] [--only NAME ...] [--[no-]spark]``.

Runs the metrics in order against scratch databases it creates (and drops),
then writes ``bench/results/<UTC stamp>.json`` / ``.md`` / ``.png`` and
prints the Markdown table. Exit status 0 whether or not targets hold (the
results say); 2 when the servers or the schema are not there.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import (
    background,
    children,
    freshness,
    history,
    relay,
    report,
    roundtrip,
    scrape,
    spark_e2e,
    spark_raw,
    staging_scale,
    throughput,
)
from bench.context import Context
from bench.plan import FULL, QUICK
from bench.servers import BenchSetupError, Servers, scratch
from bench.stats import skipped

Metric = Callable[[Context], dict[str, Any]]
METRICS: dict[str, Metric] = {
    "throughput": throughput.measure_throughput,
    "fixed_cost": throughput.measure_fixed_cost,
    "history": history.measure_history,
    "memory": children.measure_memory,
    "recovery": children.measure_recovery,
    "spark_e2e": spark_e2e.measure_spark,
    "scrape": scrape.measure_scrape,
    "background": background.measure_background,
    "spark_raw": spark_raw.measure_spark_raw,
    "roundtrip": roundtrip.measure_roundtrip,
    "stage_memory": children.measure_stage_memory,
    "relay": relay.measure_relay,
    "staging_scale": staging_scale.measure_staging_scale,
    "freshness": freshness.measure_freshness,
}
SPARK_METRICS = ("spark_e2e", "spark_raw", "freshness")  # run in full mode, or with --spark


def parse(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench", description="twophase against a direct write, with targets"
    )
    ap.add_argument("--quick", action="store_true", help="the under-two-minutes plan")
    ap.add_argument(
        "--out",
        type=Path,
        default=report.RESULTS,
        help="folder of the results files (default: bench/results)",
    )
    ap.add_argument("--only", nargs="+", choices=list(METRICS), help="run only these metrics")
    ap.add_argument(
        "--spark",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run metrics 6, 9 and 12 (default: in full mode only)",
    )
    ap.add_argument(
        "--spark-repeats",
        type=int,
        default=None,
        metavar="N",
        help="Spark job runs per side and setting of metrics 6 and 9 (default and minimum: 3)",
    )
    return ap.parse_args(argv)


def run_metric(ctx: Context, name: str, metric: Metric) -> dict[str, Any]:
    """One metric; a failure becomes a skipped entry with the error, the others still run."""
    try:
        return metric(ctx)
    except Exception as exc:  # a failed metric must not lose the others' figures
        traceback.print_exc()
        return skipped(f"failed: {type(exc).__name__}: {exc}")
    finally:
        ctx.log(f"{name} done")


def run(args: argparse.Namespace) -> dict[str, Any]:
    plan = QUICK if args.quick else FULL
    if args.spark_repeats is not None:
        plan = dataclasses.replace(plan, spark_repeats=max(1, args.spark_repeats))
    spark = args.spark if args.spark is not None else plan.spark_repeats > 0
    names = args.only or list(METRICS)
    started, clock = report.stamp(), time.monotonic()
    results: dict[str, Any] = {"started": started, "plan": plan.name, "machine": report.machine()}
    with scratch(Servers.from_env()) as made:
        ctx = Context(plan, made)
        try:
            results["metrics"] = {
                name: run_metric(ctx, name, METRICS[name])
                if name not in SPARK_METRICS or spark
                else skipped("not run: pass --spark (runs by default in full mode)")
                for name in names
            }
        finally:
            ctx.close()
    results["seconds"] = round(time.monotonic() - clock, 1)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        results = run(args)
    except BenchSetupError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    paths = report.write(results, args.out)
    print(report.markdown(results))
    print("\n".join(f"{kind}: {path}" for kind, path in paths.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
