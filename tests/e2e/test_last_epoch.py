"""A crash in the job's last epoch, then a restart with no new input (I7).

The restarted job (``--available-now``) has no batch to run, so nothing commits: only
the claim at its start (``twophase.spark.claim_query``) can deliver what the crash
left. One data batch, and no watermark-only batch after it
(``spark.sql.streaming.noDataMicroBatches.enabled=false``), so the crashed epoch is
the last one Spark will ever run for this input.

* Inline promotion: Spark logs an epoch only once its commit returned, COMMITTED, so a
  crash anywhere in it leaves the epoch out of Spark's log and the restart re-runs it
  (a replay, detected).
* Background promotion: commit returns once the epoch is decided and handed off, and
  Spark logs it while it promotes. The promoter is held at a crash point (paused there)
  until Spark has logged the epoch, then the whole driver is SIGKILLed: an epoch Spark
  considers done is left PRECOMMITTED, half sent (``promote_batch``) or all sent but
  not marked (``after_promote``). The restart's claim promotes it.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from jobs.generate_events import expected
from tests.e2e.harness import (
    KILL_TIMEOUT_S,
    MALFORMED,
    SINK,
    SINKS,
    Job,
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

FILES = 2  # one micro-batch: epoch 0 is the last
NO_WATERMARK_BATCH = ["--conf", "spark.sql.streaming.noDataMicroBatches.enabled=false"]
HELD_S = 600.0  # the promoter sleeps at the crash point until the test kills the driver
LAST_EPOCH_CRASHES = [
    pytest.param("inline", "after_decide", marks=pytest.mark.full),
    pytest.param("inline", "after_mark", marks=pytest.mark.full),
    ("background", "promote_batch"),  # the case only the restart's claim can deliver
    pytest.param("background", "after_promote", marks=pytest.mark.full),
]


def start(
    target: Target, work: Path, promotion: str, plan: Path | None = None, *, run: bool = False
) -> Job:
    """The job on the test's input; with ``run``, waited for until it ends."""
    return (run_job if run else start_job)(
        target,
        work / "input",
        work / "checkpoint",
        SINK,
        work / "logs",
        max_files=FILES,
        crash_plan=plan,
        extra_args=NO_WATERMARK_BATCH,
        TWOPHASE_PROMOTION=promotion,
    )


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("promotion", "point"), LAST_EPOCH_CRASHES)
def test_sigkill_in_the_last_epoch_then_restart_with_no_new_input(
    target: Target, work: Path, event_files: list[Path], promotion: str, point: str
) -> None:
    fed = event_files[:FILES]
    feed(work / "input", fed)
    plan = work / "crash-plan.json"
    held = promotion == "background"
    arm(plan, f"{point}:1", sink=SINK, pause_s=HELD_S if held else None)
    job = start(target, work, promotion, plan)
    if held:
        logged = work / "checkpoint" / "stats" / "commits" / "0"
        job.wait_for(
            "the held epoch in Spark's commit log",
            lambda: fired(plan).exists() and logged.exists(),
            KILL_TIMEOUT_S,
        )
        job.kill()
    else:
        assert job.wait(KILL_TIMEOUT_S) == -signal.SIGKILL, job.tail()
    assert fired(plan).exists()
    at_crash = epochs(target.staging_url, SINK)
    assert [(e["epoch"], e["state"]) for e in at_crash][-1:] == [
        (0, "COMMITTED" if point == "after_mark" else "PRECOMMITTED")
    ], at_crash
    assert at_crash[-1]["points"] > 0, at_crash  # a data epoch

    restarted = start(target, work, promotion, run=True)
    assert restarted.returncode == 0, restarted.tail()
    assert restarted.records("DONE"), restarted.tail()
    assert not mismatches(target.influx, fed)
    assert decided_dead_letters(target.staging_url, MALFORMED) == expected(fed).malformed
    for sink in SINKS:
        assert {e["state"] for e in epochs(target.staging_url, sink)} == {"COMMITTED"}, sink
    (last,) = epochs(target.staging_url, SINK)
    if held:  # Spark ran nothing again: the claim at the start delivered it
        assert (last["replays"], last["promote_attempts"]) == (0, 2), last
        assert "recovered epochs [0] at its claim" in restarted.stderr(), restarted.tail()
    else:  # Spark re-ran the epoch it had not logged: a replay, detected
        assert last["replays"] >= 1, last
