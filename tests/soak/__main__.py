"""The long soak, from the repository root with the test servers' tools installed:

    python -m tests.soak --seed 11 --events-per-sink 100000 --faults 24

Prints the schedule first (replay a failure with the same arguments), then the
report; writes it as JSON (``--report``, default ``bench/results/soak-<time>.json``).
Exits 1 unless every sink is exact.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from tests.soak.soak import Plan, Soak, write_report
from tests.support import REPO


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--events-per-sink", type=int, default=100_000)
    ap.add_argument("--files-per-sink", type=int, default=100)
    ap.add_argument("--faults", type=int, default=24)
    ap.add_argument("--span", type=float, default=400.0, help="seconds the faults spread over")
    ap.add_argument("--feed-every", type=float, default=3.0, help="seconds between two files")
    ap.add_argument("--report", type=Path, default=None)
    args = ap.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    report_path = args.report or REPO / "bench" / "results" / f"soak-{stamp}.json"
    with tempfile.TemporaryDirectory(prefix="twophase-soak-") as work:
        plan = Plan(
            seed=args.seed,
            events_per_sink=args.events_per_sink,
            faults=args.faults,
            span_s=args.span,
            work=Path(work),
            files_per_sink=args.files_per_sink,
            feed_every_s=args.feed_every,
            finish_timeout_s=1800.0,
        )
        soak = Soak(plan, log=lambda line: print(line, flush=True))
        report = soak.run()
    print(report.table(), flush=True)
    write_report(report, report_path)
    print(f"report: {report_path}")
    leaked = soak.secrets_in_cli_output()
    if leaked:
        print("a secret appeared in a CLI output", file=sys.stderr)
    return 0 if report.exact and not leaked else 1


if __name__ == "__main__":
    sys.exit(main())
