"""A frozen driver never wedges the sink: a driver stopped with SIGSTOP (a VM pause, a
host that still answers TCP) holds its sessions open, with their row locks or advisory
locks. A new run on the same sink finishes by itself beside it; the frozen one, thawed,
is fenced and lands nothing; InfluxDB then holds exactly what a crash-free run writes.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.crash_driver import read_log
from tests.integration.crash_helpers import (
    EPOCHS,
    dead_letters,
    every_epoch_committed,
    run_driver,
    staging_summary,
    start_driver,
)
from tests.support import influx_rows
from twophase.config import TargetConfig

SESSION = ("--session-timeout", "3s")  # staging_session_timeout of every driver here
# Where the first driver is frozen, and what it holds there:
FREEZES = [
    # the mark's transaction of epoch 1: the sink's row, which the next run's claim
    # needs (PostgreSQL ends the idle session after staging_session_timeout)
    ("in_mark:2", None),
    # mid-recovery of epoch 1, left decided by a killed run: the sink's recovery lock,
    # a session-level lock on an idle session (the next run, having fenced it, ends it)
    ("promote_batch:1", "after_decide:2"),
]


@pytest.mark.parametrize(("at", "killed_at"), FREEZES, ids=[f[0].split(":")[0] for f in FREEZES])
def test_a_new_run_finishes_beside_a_frozen_one_which_thawed_lands_nothing(
    at: str,
    killed_at: str | None,
    crash_free: dict[str, Any],
    staging_url: str,
    influx: TargetConfig,
    tmp_path: Path,
) -> None:
    log, plan = tmp_path / "spark-commit-log", tmp_path / "plan.json"
    if killed_at is not None:  # a crashed run leaves epoch 1 for the next claim to recover
        killed = run_driver(staging_url, influx, log, "run-0", crash=killed_at, extra=SESSION)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
    plan.write_text(f'{{"at": "{at}", "scope": "process", "pause_s": 2}}')
    frozen = start_driver(staging_url, influx, log, "run-1", extra=SESSION, plan=plan)
    fired = plan.with_name(plan.name + ".fired")
    deadline = time.monotonic() + 120
    while not fired.exists():
        assert frozen.poll() is None and time.monotonic() < deadline, frozen.communicate()
        time.sleep(0.02)
    os.kill(frozen.pid, signal.SIGSTOP)  # inside its 2 s pause: its sessions stay open
    try:
        started = time.monotonic()
        decided = [row[0] for row in staging_summary(staging_url)["epochs"]]
        new = run_driver(staging_url, influx, log, "run-2", perturb=decided, extra=SESSION)
        took = time.monotonic() - started
        assert new.returncode == 0, new.stderr
        assert read_log(log)[-1] == EPOCHS - 1
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    _, err = frozen.communicate(timeout=120)
    assert frozen.returncode == 1 and "FencedError" in err, err
    assert influx_rows(influx, "crash") == crash_free["rows"]
    assert dead_letters(staging_url) == crash_free["dead"]
    assert staging_summary(staging_url)["epochs"] == every_epoch_committed()
    assert took < 60, took  # the frozen one was not waited out for ever
