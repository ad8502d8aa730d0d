"""The seeds' job frozen inside an epoch's mark, and the same job started again on the
same checkpoint beside it: the new run finishes by itself, and the frozen one, thawed,
is fenced and lands nothing; InfluxDB is exact.

The first job pauses at ``in_mark`` (its mark transaction open, the sink's row locked)
and is then stopped whole with SIGSTOP, its JVM and Python processes with it, as a
paused VM is. Its sessions stay open and answer TCP; only PostgreSQL's limits
(``staging_session_timeout``, at its default) and fencing free the sink.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from jobs.generate_events import expected
from tests.e2e.harness import (
    KILL_TIMEOUT_S,
    MALFORMED,
    SINK,
    SINKS,
    Target,
    arm,
    decided_dead_letters,
    epochs,
    feed,
    fired,
    mismatches,
    run_job,
    start_job,
)

FILES = 4  # two micro-batches of two files: the second's mark is where it freezes
PAUSE_S = 5.0  # at the point, long enough for the test to stop the whole job


@pytest.mark.full  # the default run has it without Spark: tests/integration/test_frozen_driver.py
@pytest.mark.timeout(900)
def test_a_job_started_beside_a_frozen_one_finishes_and_the_thawed_one_lands_nothing(
    target: Target, work: Path, event_files: list[Path]
) -> None:
    fed = event_files[:FILES]
    feed(work / "input", fed)
    plan = work / "crash-plan.json"
    arm(plan, "in_mark:2", scope="process", sink=SINK, pause_s=PAUSE_S)

    frozen = start_job(
        target,
        work / "input",
        work / "checkpoint",
        SINK,
        work / "logs",
        max_files=2,
        crash_plan=plan,
    )
    frozen.wait_for("the pause in epoch 1's mark", fired(plan).exists, KILL_TIMEOUT_S, 0.02)
    os.killpg(frozen.proc.pid, signal.SIGSTOP)  # the whole job: JVM, driver, workers
    try:
        restarted = run_job(
            target, work / "input", work / "checkpoint", SINK, work / "logs", max_files=2
        )
    finally:
        os.killpg(frozen.proc.pid, signal.SIGCONT)
    assert restarted.returncode == 0, restarted.tail()
    assert frozen.wait() != 0, frozen.tail()
    assert "FencedError" in frozen.stderr(), frozen.tail()
    assert not mismatches(target.influx, fed)
    assert decided_dead_letters(target.staging_url, MALFORMED) == expected(fed).malformed
    for sink in SINKS:
        assert {e["state"] for e in epochs(target.staging_url, sink)} == {"COMMITTED"}, sink
