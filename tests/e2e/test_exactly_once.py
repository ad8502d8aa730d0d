"""I7 with real Spark: SIGKILL the whole driver at each protocol step and at random
moments, restart from the checkpoint, and InfluxDB holds exactly the aggregates
computed from the input without Spark -- nothing missing, nothing doubled, no
extra point -- with every malformed line dead-lettered once.

Starting Spark costs 10-20 s here, so the protocol-step test runs one chain:
a job runs continuously, a crash point is armed while it is idle, new input
makes it fire, the job is restarted, and the test waits until InfluxDB is
exact again before arming the next one. The same chain then shows a task
failure that Spark retries, and the refusal of a second query and of a reset
checkpoint.
"""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobs.generate_events import expected
from tests.e2e.chain import (
    FILES_PER_STEP,
    ON_INPUT,
    Chain,
    crash_and_recover,
    kill_at_every_point,
)
from tests.e2e.harness import (
    KILL_TIMEOUT_S,
    MALFORMED,
    SINK,
    SINKS,
    Job,
    Target,
    arm,
    decided_dead_letters,
    disarm,
    epochs,
    feed,
    fired,
    influx_stats,
    mismatches,
    orphan_writes,
    run_job,
    staged_lanes,
    start_job,
)
from tests.integration.cli_helpers import make_cli
from tests.support import admin_conninfo

# The kill mid-promotion (promote_batch), the same crash_and_recover through the same
# chain, is test_measurement_column.py's default test: not repeated here (a job start).
STEPS = ("after_stage", "after_decide", "after_promote", "after_mark")
CLUSTER = "local-cluster[2,1,1024]"


def test_sigkill_at_each_protocol_step_then_restart(
    target: Target, work: Path, event_files: list[Path]
) -> None:
    chain = Chain(target, work, event_files)
    chain.feed(2)
    chain.wait_exact()
    for point in STEPS:
        crash_and_recover(chain, point)
    task_failure_is_retried(chain)
    second_query_and_reset_checkpoint_are_refused(chain)


def task_failure_is_retried(chain: Chain) -> None:
    """A Python worker dies right after staging (its write is committed in PostgreSQL,
    its message never reaches the driver): Spark retries the task, the retry stages
    again, and only the retry's write is counted."""
    orphans_before = orphan_writes(chain.target.staging_url)
    arm(chain.plan, "after_stage:1", "process")
    chain.feed(FILES_PER_STEP)
    chain.job.wait_for("the task failure", fired(chain.plan).exists, KILL_TIMEOUT_S)
    chain.wait_exact()
    assert chain.job.returncode is None  # the query survived the failed task
    assert orphan_writes(chain.target.staging_url) > orphans_before
    assert "Lost task" in chain.job.stderr() or "exited unexpectedly" in chain.job.stderr()
    for sink, sink_epochs in chain.epochs().items():
        assert all(e["state"] == "COMMITTED" for e in sink_epochs), sink
    disarm(chain.plan)


def second_query_and_reset_checkpoint_are_refused(chain: Chain) -> None:
    """I6: a second query on the sink (while the first runs) and the same job from a
    deleted checkpoint are both refused with an error naming the sink and the way out;
    InfluxDB is untouched by them."""
    before = influx_stats(chain.target.influx)
    second = run_job(
        chain.target,
        chain.work / "input",
        chain.work / "other-checkpoint",
        SINK,
        chain.work / "logs",
        max_files=2,
    )
    assert_refused(second)
    assert chain.job.returncode is None  # the owner keeps running
    assert influx_stats(chain.target.influx) == before

    chain.job.kill()
    shutil.rmtree(chain.work / "checkpoint")
    reset = run_job(
        chain.target,
        chain.work / "input",
        chain.work / "checkpoint",
        SINK,
        chain.work / "logs",
        max_files=2,
    )
    assert_refused(reset)
    assert influx_stats(chain.target.influx) == before
    assert not mismatches(chain.target.influx, chain.fed)
    owners = {e["query_id"] for s in SINKS for e in chain.epochs()[s]}
    assert len(owners) == 1  # the job's one query owns both sinks: the refused ones decided nothing


def assert_refused(job: Job) -> None:
    assert job.returncode == 2, job.tail()
    message = job.stderr()
    assert "CheckpointResetError" in message, job.tail()
    assert f"sink '{SINK}'" in message or f"sink '{MALFORMED}'" in message, job.tail()
    assert "twophase reset" in message, job.tail()


# Every crash point a Spark job reaches (chain.ON_INPUT, chain.AT_RESTART), in one chain
# per mode (about 25 s a point). The job's foreachBatch writer stages its small batches
# from the driver; with driver_staging_bytes 0, in Spark tasks.
@pytest.mark.timeout(2400)
@pytest.mark.full
@pytest.mark.parametrize(
    ("promotion", "lanes", "driver_staging_bytes"),
    [("inline", 1, "4194304"), ("background", 4, "4194304"), ("background", 4, "0")],
)
def test_sigkill_at_every_crash_point_on_spark(
    target: Target,
    work: Path,
    event_files: list[Path],
    promotion: str,
    lanes: int,
    driver_staging_bytes: str,
) -> None:
    chain = Chain(
        target,
        work,
        event_files,
        TWOPHASE_PROMOTION=promotion,
        TWOPHASE_PROMOTE_CONNECTIONS=str(lanes),
        TWOPHASE_DRIVER_STAGING_BYTES=driver_staging_bytes,
        TWOPHASE_GC_INTERVAL="1s",  # in_gc: the automatic GC, purging at once
        TWOPHASE_RETENTION="0s",
    )
    chain.feed(2)
    chain.wait_exact()
    kill_at_every_point(chain, ON_INPUT + (("drain",) if promotion == "background" else ()))
    for sink in SINKS:
        assert {e["state"] for e in chain.epochs()[sink]} == {"COMMITTED"}, sink
    chain.job.kill()


# Six job starts on local-cluster (each first batch starts executors: ~30 s) take
# 5-7 minutes on an idle 2-core machine; give a loaded machine room. Both sides run with
# --full only. The default run kills drivers at every protocol step (above), on a
# standalone cluster (test_standalone.py) and under Spark Connect with the data source
# (test_connect.py); it kills a driver that promotes in the background, beside sinks
# promoting over one and four lanes, in the soak (tests/soak); and the integration crash
# matrix kills every crash point inline and in the background, over one and four lanes.
@pytest.mark.timeout(1800)
@pytest.mark.full
@pytest.mark.parametrize(
    ("promotion", "stats_writer", "lanes"),
    [("inline", "data-source", 1), ("background", "foreach-batch", 4)],
)
def test_random_sigkills_over_twenty_batches(
    target: Target,
    work: Path,
    event_files: list[Path],
    promotion: str,
    stats_writer: str,
    lanes: int,
) -> None:
    """Kill the driver 5 times at random moments of a 24-batch run, on a multi-process
    cluster (local-cluster: a master, two workers and their executors, each in its own
    JVM with its own Python workers): inline, the stats through the data source in
    complete mode (each epoch re-sends every window); in the background (which the
    data source refuses), through the foreachBatch adapter in update mode, promoted
    over four lanes.

    A moment is a random delay once the run writes, or the first instant the test
    sees a write staged but not voted on, or an epoch decided but not committed:
    uniform random delays alone mostly land in Spark's computing, not in the protocol.
    """
    seed = int(time.time())
    rng = random.Random(seed)
    moments = ["delay", "staged", "decided", rng.choice(KILL_MOMENTS), rng.choice(KILL_MOMENTS)]
    rng.shuffle(moments)
    feed(work / "input", event_files)
    args = (target, work / "input", work / "checkpoint", SINK, work / "logs")
    kills: list[str] = []
    for moment in moments:
        with psycopg.connect(admin_conninfo(target.staging_url), autocommit=True) as conn:
            baseline = {name: conn.execute(sql).fetchone() for name, sql in MOMENT_SQL.items()}
            job = start_job(
                *args,
                available_now=False,
                master=CLUSTER,
                stats_writer=stats_writer,
                TWOPHASE_PROMOTION=promotion,
                TWOPHASE_PROMOTE_CONNECTIONS=str(lanes),
            )
            wait_for_moment(job, conn, moment, baseline, rng)
        if job.returncode is None:
            job.kill()
            kills.append(f"{moment}: {protocol_state(target)}")
    print(f"seed {seed}; killed at: " + "; ".join(kills))
    cli = make_cli(target.staging_url, target.influx)
    # A SIGKILLed driver records no end: its run looks live for the live window, and the
    # operator's commands that would fence it refuse (recover only when it has work;
    # resend, while an epoch is pending, first asks for a recover, which refuses).
    (seen,) = cli.run("status", "--sink", SINK, "--json").json()["sinks"]
    assert seen["owner_state"] == "live", seen
    if seen["precommitted_epochs"]:
        would_fence = [["recover", "--sink", SINK]]
        pending = cli.run("resend", "--sink", SINK, "--all")
        assert pending.code == 1 and f"run `twophase recover --sink {SINK}` first" in pending.err
    elif seen["last_committed_epoch"] is not None:
        would_fence = [["resend", "--sink", SINK, "--all"]]
    else:
        would_fence = []
    for command in would_fence:
        refused = cli.run(*command)
        assert refused.code == 1 and "stop its query first, or pass --force" in refused.err
    final = run_job(
        *args,
        master=CLUSTER,
        stats_writer=stats_writer,
        TWOPHASE_PROMOTION=promotion,
        TWOPHASE_PROMOTE_CONNECTIONS=str(lanes),
    )
    assert final.returncode == 0, final.tail()
    assert len(kills) == 5, f"seed {seed}: the job ended by itself"
    assert len(epochs(target.staging_url, SINK)) >= 20
    problems = mismatches(target.influx, event_files)
    assert not problems, (f"seed {seed}", kills, problems[:20])
    assert decided_dead_letters(target.staging_url, MALFORMED) == expected(event_files).malformed
    assert staged_lanes(target.staging_url, SINK) == set(range(lanes))  # the executors' lanes
    for sink in SINKS:
        assert {e["state"] for e in epochs(target.staging_url, sink)} == {"COMMITTED"}
    # The run that completed recorded its end: the operator needs no --force.
    status = {s["sink_id"]: s for s in cli.run("status", "--json").json()["sinks"]}
    ends = {sink: (status[sink]["owner_state"], status[sink]["owner_end_reason"]) for sink in SINKS}
    assert ends == {sink: ("ended", "stopped") for sink in SINKS}, status
    resent = cli.run("resend", "--sink", SINK, "--all")
    assert resent.code == 0, resent
    assert not mismatches(target.influx, event_files)  # the resend rewrote the same points


KILL_MOMENTS = ("delay", "staged", "decided")
MOMENT_SQL = {
    # every staged write (a batch is being written)
    "writing": "SELECT count(*) FROM twophase_writes",
    # writes no decision covers yet (between stage and decide, or orphans)
    "staged": "SELECT count(*) FROM twophase_writes w WHERE NOT EXISTS (SELECT 1 FROM"
    " twophase_epochs e WHERE e.sink_id = w.sink_id AND e.epoch = w.epoch)",
    # epochs decided, not yet committed
    "decided": "SELECT array_agg(sink_id || '#' || epoch ORDER BY sink_id, epoch)"
    " FROM twophase_epochs WHERE state = 'PRECOMMITTED'",
}


def wait_for_moment(
    job: Job,
    conn: psycopg.Connection[Any],
    moment: str,
    baseline: dict[str, Any],
    rng: random.Random,
) -> None:
    """Return at the chosen moment of this run (polled every few milliseconds): a new
    write staged but not decided, a new epoch decided but not committed, or a random
    delay once the run writes. The first batch of a run also recovers the epoch the
    previous kill left, so kills land in recovery as well."""
    name = "writing" if moment == "delay" else moment

    def changed() -> bool:
        row = conn.execute(MOMENT_SQL[name]).fetchone()
        now, before = (row or (None,))[0], (baseline[name] or (None,))[0]
        if name == "decided":  # a new set of PRECOMMITTED epochs, not an empty one
            return now is not None and now != before
        return int(now or 0) > int(before or 0)  # more writes than before

    job.wait_for(f"a {moment} moment", changed, timeout=KILL_TIMEOUT_S, interval=0.005)
    if moment == "delay":
        time.sleep(rng.uniform(0.0, 3.0))


def protocol_state(target: Target) -> str:
    """Where a kill landed: epochs decided but not committed, writes never voted on."""
    pending = [
        f"{sink}#{e['epoch']}"
        for sink in SINKS
        for e in epochs(target.staging_url, sink)
        if e["state"] == "PRECOMMITTED"
    ]
    return f"precommitted {pending or 'none'}, orphans {orphan_writes(target.staging_url)}"
