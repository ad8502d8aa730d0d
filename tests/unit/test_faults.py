"""Crash points kill the real process with SIGKILL, on the n-th hit only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

SCRIPT = (
    "from twophase.faults import crash_point\n"
    "for i in range(5):\n"
    "    crash_point('other')\n"
    "    crash_point('here')\n"
    "    print(i, flush=True)\n"
)


def run(crash: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TWOPHASE_CRASH_AT"}
    if crash:
        env["TWOPHASE_CRASH_AT"] = crash
    return subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_no_crash_point_set_runs_through() -> None:
    done = run(None)
    assert (done.returncode, done.stdout.split()) == (0, ["0", "1", "2", "3", "4"])


def test_nth_hit_is_sigkilled() -> None:
    done = run("here:3")
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.split() == ["0", "1"]
