"""``python -m bench SCENARIO [--quick] [--repeats N] [--only CASE...] [--out DIR]
[--work DIR] [--no-chart] [--old REV]``.

Runs one scenario (``bench/scenarios/<SCENARIO>.py``) against scratch databases it
creates and drops, writes ``<out>/<SCENARIO>-<UTC stamp>.json``, ``.md`` and ``.png``,
and prints the Markdown. Exit status 0 when it ran, 1 when a run failed, 2 when the
servers or the schema are not there.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from bench.harness import report
from bench.harness.scenario import Context, Scenario, measure
from bench.harness.servers import BenchSetupError, Servers, scratch

SCENARIOS = ("throughput", "costs", "fanout", "pg_target", "pipelines", "versions")


def load(name: str) -> Scenario:
    scenario: Scenario = importlib.import_module(f"bench.scenarios.{name}").SCENARIO
    return scenario


def parse(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench",
        description="twophase against what a user writes instead, one scenario a run",
        epilog="bench/README.md says what each scenario measures",
    )
    ap.add_argument("scenario", choices=SCENARIOS)
    ap.add_argument("--quick", action="store_true", help="the tiny plan (a smoke run)")
    ap.add_argument("--repeats", type=int, default=None, help="runs per side and case")
    ap.add_argument("--out", type=Path, default=report.RESULTS, help="default: bench/results")
    ap.add_argument("--only", nargs="+", metavar="CASE", help="run only these cases")
    ap.add_argument("--work", type=Path, default=None, help="keep logs and checkpoints here")
    ap.add_argument("--no-chart", action="store_true", help="JSON and Markdown only")
    ap.add_argument("--old", default="HEAD", help="versions: the git revision compared")
    return ap.parse_args(argv)


def run(args: argparse.Namespace) -> int:
    scenario = load(args.scenario)
    started, clock = report.stamp(), time.monotonic()
    with scratch(Servers.from_env()) as made:
        if args.work is not None:
            args.work.mkdir(parents=True, exist_ok=True)
        work = args.work or Path(tempfile.mkdtemp(prefix="twophase-bench-"))
        ctx = Context(args.quick, made, work, keep=args.work is not None, old=args.old)
        try:
            cases = measure(scenario, ctx, args.repeats, args.only)
        except Exception:  # said, the scratch databases still dropped
            traceback.print_exc()
            return 1
        finally:
            ctx.close()
    results = {
        "scenario": scenario.name,
        "about": scenario.about,
        "started": started,
        "plan": "quick" if args.quick else "full",
        "repeats": args.repeats or scenario.repeats[0 if args.quick else 1],
        "machine": report.machine(),
        "sides": list(scenario.sides),
        "cases": cases,
        "notes": list(scenario.notes),
        "headline": list(scenario.headline),
        "seconds": round(time.monotonic() - clock, 1),
    }
    if scenario.name == "versions":
        results["old"] = args.old
    path = report.write(results, args.out, draw=not args.no_chart)
    print(report.markdown(results))
    print(f"written: {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        return run(args)
    except BenchSetupError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
