"""The bench's one command.

``python -m bench [--quick] [--only METRIC ...] [--[no-]spark]`` runs the
numbered metrics (``METRICS``) in order against scratch databases it creates
(and drops), then writes ``bench/results/<UTC stamp>.json`` / ``.md`` /
``.png`` and prints the Markdown table.

``python -m bench PART [OPTIONS]`` runs one part alone (``PARTS``: a study, or
a metric with options of its own), with the results file and options of that
part (``python -m bench PART --help``); the part is ``bench/<PART>.py``'s
``main``.

Exit status 0 whether or not targets hold (the results say); 2 when the
servers or the schema are not there.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
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

# ``python -m bench PART [OPTIONS]``: bench/<PART>.py's ``main(argv) -> int``, by itself.
PARTS: dict[str, str] = {
    "spark_raw": "metric 9 alone, on the links named (--link loopback --link slow)",
    "freshness": "metric 12 alone (--link slow; --quick: smaller)",
    "relay": "metric 13 alone (--points N --repeats N)",
    "staging_scale": "metric 14 alone",
    "steps": "one 1M-point epoch, step by step",
    "fencing": "promotion with and without its fencing check",
    "request_size": "promote request sizes (target_batch_points): points/s, driver CPU",
    "fanout": "two InfluxDB targets against one: 3-4.5 minutes",
    "versions": "metric 2 of this checkout against another ref's (--old REF)",
    "encode": "encoding on executors: row builder vs columnar, no servers",
    "costs": "what exactly-once costs against a plain foreachBatch, one table: ~20 minutes",
    "pg_target": "twophase into a PostgreSQL target against a plain foreachBatch upsert",
}


def parse(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench",
        usage="python -m bench [OPTIONS] | python -m bench PART [PART'S OPTIONS]",
        description="twophase against a direct write, with targets",
        epilog="parts, run alone with options of their own (python -m bench PART --help): "
        + "; ".join(f"{name}: {what}" for name, what in PARTS.items()),
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
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in PARTS:
        part = importlib.import_module(f"bench.{argv[0]}")
        return _setup_checked(f"bench {argv[0]}", lambda: int(part.main(argv[1:])))
    return _setup_checked("bench", lambda: _run_metrics(parse(argv)))


def _run_metrics(args: argparse.Namespace) -> int:
    results = run(args)
    return report.finish(report.markdown(results), report.write(results, args.out))


def _setup_checked(prog: str, run_part: Callable[[], int]) -> int:
    """``run_part()``; exit status 2, said on stderr, when the servers or the schema are
    not there."""
    try:
        return run_part()
    except BenchSetupError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
