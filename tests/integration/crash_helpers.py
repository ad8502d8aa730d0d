"""The crash driver (tests/integration/crash_driver.py) as a child process, and what a
run of it leaves in the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from tests.integration.crash_driver import BAD_EPOCH, PARTITIONS, POINTS_PER_PARTITION
from tests.support import REPO, admin_conninfo
from twophase.config import TargetConfig

EPOCHS = 4


SINK = "crash-sink"


def run_driver(*args: Any, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """:func:`start_driver`, waited for."""
    driver = start_driver(*args, **kwargs)
    out, err = driver.communicate(timeout=300)
    return subprocess.CompletedProcess(driver.args, driver.returncode, out, err)


def start_driver(
    staging_url: str,
    influx: TargetConfig,
    log: Path,
    run_id: str,
    crash: str | None = None,
    perturb: list[int] | None = None,
    batch_points: int = 40,
    promotion: str = "inline",
    lanes: int = 1,
    arm_last: tuple[Path, dict[str, Any]] | None = None,
    extra: Sequence[str] = (),
    layout: tuple[str, int | None] = ("gzip", None),
    epochs: int = EPOCHS,
    plan: Path | None = None,
) -> subprocess.Popen[str]:
    """The driver as a child process; ``arm_last``: a crash plan file and the plan the
    driver arms there once every epoch but the last is promoted; ``extra``: more
    arguments (``--gc-interval``, ``--retention``); ``layout``: the compression and
    chunk size of staging (None: the default, one chunk per 100-line write); ``plan``: a
    crash plan file the driver reads from the start."""
    compression, chunk_points = layout
    extra = [*extra, "--compression", compression]
    if chunk_points is not None:
        extra += ["--chunk-points", str(chunk_points)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TWOPHASE_CRASH")}
    if crash:
        env["TWOPHASE_CRASH_AT"] = crash
    if plan is not None:
        env["TWOPHASE_CRASH_PLAN"] = str(plan)
    cmd = [
        sys.executable,
        "-m",
        "tests.integration.crash_driver",
        "--staging-url",
        staging_url,
        "--influx-url",
        influx.url,
        "--influx-db",
        str(influx.influxdb.database),
        "--sink",
        SINK,
        "--epochs",
        str(epochs),
        "--spark-log",
        str(log),
        "--run-id",
        run_id,
        "--perturb",
        ",".join(map(str, perturb or [])),
        "--batch-points",
        str(batch_points),
        "--promotion",
        promotion,
        "--lanes",
        str(lanes),
        *extra,
    ]
    if arm_last is not None:
        env["TWOPHASE_CRASH_PLAN"] = str(arm_last[0])
        cmd += ["--arm-last", json.dumps(arm_last[1])]
    return subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def dead_letters(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(admin_conninfo(url)) as conn:
        return conn.execute(
            "SELECT epoch, phase, payload FROM twophase_dead_letters ORDER BY epoch, payload"
        ).fetchall()


def staging_summary(url: str) -> dict[str, Any]:
    with psycopg.connect(admin_conninfo(url)) as conn:
        states = conn.execute(
            "SELECT epoch, state, points_staged, points_delivered,"
            " points_rejected_promote FROM twophase_epochs ORDER BY epoch"
        )
        return {"epochs": states.fetchall()}


def every_epoch_committed() -> list[tuple[Any, ...]]:
    """:func:`staging_summary`'s epochs once a run completed: each COMMITTED, the bad
    point of its epoch rejected at promotion."""
    per_epoch = PARTITIONS * POINTS_PER_PARTITION
    return [
        (e, "COMMITTED", per_epoch + (e == BAD_EPOCH), per_epoch, int(e == BAD_EPOCH))
        for e in range(EPOCHS)
    ]
