"""Metric 2 (the fixed cost of a small epoch, one target) of two versions of twophase,
in one run, interleaved: did a change make the per-epoch cost grow?

::

    python -m bench versions --old REF [--rounds 8] [--epochs 100] [--warm 20]

The version checked out here is "new"; ``REF`` (a commit, a tag) is "old",
checked out by ``git worktree add`` into a temporary directory and removed
after. Each version gets a staging database of its own, migrated by its own
``alembic upgrade head``, and an InfluxDB database of its own. Each round
starts a fresh process per version (``bench/version_child.py``, in its
checkout), alternating which goes first, that runs ``--warm`` 10-point
epochs and then times ``--epochs`` more, each staged and committed
(recover, decide, promote, mark) as a sink does. Reports the medians over
every measured epoch, and old ÷ new: above 1, the new version is faster.
The result is written to ``bench/results/<stamp>-versions.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.report import write_json
from bench.servers import REPO, Servers, scratch
from bench.stats import Summary

CHILD = Path(__file__).with_name("version_child.py")
FIXED_POINTS = 10


def main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench versions", description=__doc__)
    ap.add_argument("--old", required=True, help="the git ref of the old version")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--warm", type=int, default=20)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="twophase-old-") as tmp:
        old_tree = Path(tmp) / "old"
        _git("worktree", "add", "--detach", str(old_tree), args.old)
        try:
            result = compare({"old": old_tree, "new": REPO}, args)
        finally:
            _git("worktree", "remove", "--force", str(old_tree))
    result["old_ref"] = args.old
    result["new_ref"] = _git("rev-parse", "--short", "HEAD").strip()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    write_json(result, args.out / f"{stamp}-versions.json")
    print(json.dumps({k: v for k, v in result.items() if k != "summary"}, indent=2))
    for version, summary in result["summary"].items():
        print(f"{version}: median {summary['median']} ms (min {summary['min']}, n {summary['n']})")
    return 0


def compare(trees: dict[str, Path], args: argparse.Namespace) -> dict[str, Any]:
    """Rounds of a child per version, alternating who goes first; medians and the ratio."""
    servers = Servers.from_env()
    millis: dict[str, list[float]] = {v: [] for v in trees}
    per_child = args.warm + args.epochs
    with scratch(servers) as made:
        staging = {v: made.staging_url(v, tree) for v, tree in trees.items()}
        databases = {v: made.influx(v).influxdb.database or "" for v in trees}
        for number in range(args.rounds):
            order = list(trees) if number % 2 == 0 else list(reversed(trees))
            for version in order:
                place = (staging[version], servers.influx_url, databases[version])
                millis[version] += _child(trees[version], place, args, number * per_child)
    medians = {v: statistics.median(m) for v, m in millis.items()}
    return {
        "metric": "fixed cost, ms per 10-point epoch, one target",
        "rounds": args.rounds,
        "epochs_per_round": args.epochs,
        "summary": {v: Summary.of(m).as_dict() for v, m in millis.items()},
        "old_over_new": round(medians["old"] / medians["new"], 4),
    }


def _child(
    tree: Path, place: tuple[str, str, str], args: argparse.Namespace, offset: int
) -> list[float]:
    """One child in the checkout ``tree``: its measured epochs' milliseconds.
    ``place``: the staging URL, the InfluxDB URL and database."""
    staging_url, influx_url, database = place
    command = [
        sys.executable,
        "-c",
        CHILD.read_text(),
        *("--staging-url", staging_url, "--influx-url", influx_url),
        *("--influx-db", database, "--sink", "bench-versions"),
        *("--points", str(FIXED_POINTS), "--warm", str(args.warm)),
        *("--epochs", str(args.epochs), "--offset", str(offset)),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TWOPHASE_")}
    env["PYTHONPATH"] = str(tree)
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the child of {tree} failed:\n{done.stderr[-3000:]}")
    measured: list[float] = json.loads(done.stdout.strip().splitlines()[-1])["ms"]
    return measured


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
