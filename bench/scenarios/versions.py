"""The fixed cost of a small epoch, one target, in two versions of twophase: did a
change make each epoch dearer? ``python -m bench versions --old REF``.

The working tree here is ``new``; ``REF`` (a commit, a tag; default ``HEAD``, what the
working tree changes) is ``old``, checked out by ``git worktree add`` into the run's
work folder and removed after. Each version gets a staging database migrated by its
own ``alembic upgrade head`` and an InfluxDB database of its own. Every run is a fresh
process in that version's checkout (``bench/jobs/fixed_cost_epochs.py``) that runs
warm-up epochs of 10 points, then times more, each staged and committed (decide,
promote, mark) as a sink does; the run's figure is their median.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.harness.scenario import Context, Figures, Scenario
from bench.harness.servers import REPO

CHILD = REPO / "bench" / "jobs" / "fixed_cost_epochs.py"
POINTS = 10


def prepare(ctx: Context, plan: tuple[int, int]) -> None:
    """The old version's checkout, once per run of the scenario (removed by the harness)."""
    if "trees" in ctx.state:
        return
    old = ctx.work / "old"
    _git("worktree", "add", "--detach", str(old), ctx.old)
    ctx.closers.append(lambda: _git("worktree", "remove", "--force", str(old)))
    ctx.state["trees"] = {"old": old, "new": REPO}
    ctx.state["offset"] = 0


def run(ctx: Context, side: str, plan: tuple[int, int]) -> Figures:
    warm, epochs = plan
    tree: Path = ctx.state["trees"][side]
    influx = ctx.scratch.influx(side)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TWOPHASE_")}
    env |= {
        "PYTHONPATH": str(tree),
        "TWOPHASE_STAGING_URL": ctx.scratch.staging_url(side, tree),
        "TWOPHASE_TARGET_URL": influx.url,
        "TWOPHASE_INFLUX_DB": influx.influxdb.database or "",
        "TWOPHASE_INFLUX_API": "v1",
    }
    offset = ctx.state["offset"]
    ctx.state["offset"] += warm + epochs
    command = [sys.executable, str(CHILD), "--sink", "bench-versions", "--points", str(POINTS)]
    command += ["--warm", str(warm), "--epochs", str(epochs), "--offset", str(offset)]
    command += ["--builtin-kinds"] if side == "old" else []
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the {side} version's run failed:\n{done.stderr[-3000:]}")
    millis: list[float] = json.loads(done.stdout.strip().splitlines()[-1])["ms"]
    return {"epoch_ms": round(sorted(millis)[len(millis) // 2], 4)}


def _git(*args: str) -> Any:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True)


SCENARIO = Scenario(
    name="versions",
    about="the fixed cost of a 10-point epoch, one target: this working tree against --old",
    sides=("old", "new"),
    cases=lambda quick: {"10_points": (5, 30)} if quick else {"10_points": (20, 200)},
    run=run,
    prepare=prepare,
    repeats=(1, 8),
    notes=(
        "epoch_ms: one run's median over its timed epochs (stage, decide, promote, mark); "
        "each run a fresh process of its version; the ratio is new over old",
    ),
)
