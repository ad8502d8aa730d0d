"""Crash points kill the real process with SIGKILL, on the n-th hit only."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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


SINK_SCRIPT = (
    "from twophase.faults import crash_point\n"
    "for i in range(5):\n"
    "    crash_point('here', 'stats')\n"
    "    crash_point('here', 'dead')\n"
    "    print(i, flush=True)\n"
)


def test_a_point_armed_for_one_sink_counts_only_that_sinks_steps() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TWOPHASE_CRASH")}
    env |= {"TWOPHASE_CRASH_AT": "here:2", "TWOPHASE_CRASH_SINK": "dead"}
    done = subprocess.run(
        [sys.executable, "-c", SINK_SCRIPT], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.split() == ["0"]  # the second 'dead' hit, not the second hit overall


def test_nth_hit_is_sigkilled() -> None:
    done = run("here:3")
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.split() == ["0", "1"]


SESSION_SCRIPT = (
    "import subprocess, sys, time\n"
    "from twophase.faults import crash_point\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "print(child.pid, flush=True)\n"
    "for _ in range(600):\n"
    "    crash_point('after_decide')\n"
    "    time.sleep(0.05)\n"
)


def start_armable(plan: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "TWOPHASE_CRASH_PLAN": str(plan)}
    env.pop("TWOPHASE_CRASH_AT", None)
    return subprocess.Popen(
        [sys.executable, "-c", SESSION_SCRIPT],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_plan_armed_from_outside_kills_the_whole_session_once(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    first, second = start_armable(plan), start_armable(plan)
    grandchildren = [int(p.stdout.readline()) for p in (first, second) if p.stdout]
    plan.write_text(json.dumps({"at": "after_decide", "scope": "session"}))
    deadline = time.monotonic() + 20
    while first.poll() is None and second.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # the loser, if any, would have fired by now too
    codes = sorted(p.poll() or 0 for p in (first, second))
    assert codes == [-signal.SIGKILL, 0], "exactly one process fires a plan"
    killed = first if first.poll() == -signal.SIGKILL else second
    survivor = second if killed is first else first
    assert (tmp_path / "plan.json.fired").read_text() == str(killed.pid)  # who fired
    assert not alive(grandchildren[(first, second).index(killed)])  # its session went with it
    assert alive(grandchildren[(first, second).index(survivor)])
    for proc, grandchild in zip((first, second), grandchildren, strict=True):
        with contextlib.suppress(OSError):
            os.kill(grandchild, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
