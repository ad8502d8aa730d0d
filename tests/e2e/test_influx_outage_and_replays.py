"""What the Spark job costs InfluxDB, and what an InfluxDB outage costs the job: real
Spark (the job as a subprocess, local mode), a fresh staging database per test, and a
dedicated InfluxDB 1.6.7 server each test starts on its own port, stops and restarts.

* Replays cost InfluxDB nothing. A line-counting proxy sits in front of InfluxDB; the
  driver is SIGKILLed mid-promote and right after an epoch was marked COMMITTED, and
  restarted each time. InfluxDB ends exact; the proxy saw at most the points decided
  plus those of the promotions a kill cut (re-sent whole by recovery), and the restart
  after the COMMITTED epoch sent exactly the new epochs' points: the replayed epoch
  was detected and sent nothing.
* InfluxDB outages, in one chain (Spark starts cost 20-60 s here): an outage longer
  than the retry deadline fails the query with a clear TargetUnavailableError and exit
  status 1, and a restart recovers the pending epoch; then InfluxDB is stopped for 60 s
  while that restarted job runs: promotion waits and retries within its deadline, the
  same driver carries on once InfluxDB is back, and the results are exact.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from devkit import InfluxServer
from devkit.faultproxy import FaultProxy
from devkit.ports import start_own_influx
from tests.e2e.harness import (
    KILL_TIMEOUT_S,
    MALFORMED,
    SINK,
    SINKS,
    Job,
    Target,
    arm,
    disarm,
    epochs,
    fired,
    kill_session,
    query,
    start_job,
    wait_exact,
    wait_idle,
)
from tests.e2e.harness import feed as copy_files
from twophase.config import InfluxDBSettings, TargetConfig, default

DATABASE = "e2e"
FILES_PER_STEP = 2  # with --max-files-per-trigger 2: one epoch per step, 20-40 points
EXACT_TIMEOUT_S = 150.0
OUTAGE_S = 60.0
LONG_DEADLINE = "180s"  # outlives the outage: promotion waits
SHORT_DEADLINE = "5s"  # shorter than the outage: the query fails
RETRY_MAX = "1s"  # back within a second of InfluxDB's return


@pytest.fixture
def own_influx(tmp_path: Path) -> Iterator[InfluxServer]:
    """A dedicated InfluxDB 1.x server (the test stops and starts it), database ``e2e``."""
    server = start_own_influx(tmp_path, DATABASE)
    yield server
    server.stop()


def influx_at(url: str) -> TargetConfig:
    return TargetConfig(url=url, influxdb=InfluxDBSettings(api="v1", database=DATABASE))


class Inputs:
    """The job's input folder, fed from the session's event files in order."""

    def __init__(self, work: Path, event_files: Sequence[Path]) -> None:
        self.folder = work / "input"
        self.pending = list(event_files)
        self.fed: list[Path] = []

    def feed(self, count: int = FILES_PER_STEP) -> None:
        new, self.pending = self.pending[:count], self.pending[count:]
        assert len(new) == count, "not enough event files for this test"
        self.fed += new
        copy_files(self.folder, new)


def start(target: Target, work: Path, *, crash_plan: Path | None = None, **env: str) -> Job:
    """The job, running continuously (500 ms trigger), two files per micro-batch."""
    extra: list[str] = []
    if crash_plan is not None:
        # Crash points fire only in the driver's own Python process, where foreachBatch
        # decides and promotes the epochs; each test arms them for the stats sink, which
        # sends to InfluxDB (its dead-letter sink sends nothing). Python workers (the
        # staging tasks) get a plan that never exists.
        never = work / "workers-never-crash.json"
        extra = ["--conf", f"spark.executorEnv.TWOPHASE_CRASH_PLAN={never}"]
    return start_job(
        target,
        work / "input",
        work / "checkpoint",
        SINK,
        work / "logs",
        available_now=False,
        max_files=2,
        crash_plan=crash_plan,
        extra_args=extra,
        **env,
    )


def killed_by_crash_point(job: Job, plan: Path) -> None:
    code = job.wait(KILL_TIMEOUT_S)
    kill_session(job.proc.pid)
    assert code == -signal.SIGKILL, (code, job.tail())
    assert fired(plan).exists()


def by_epoch(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {row["epoch"]: row for row in rows}


def sink_epochs(url: str) -> dict[str, dict[int, dict[str, Any]]]:
    return {sink: by_epoch(epochs(url, sink)) for sink in SINKS}


def promotion_sends(
    before: dict[str, dict[int, dict[str, Any]]], after: dict[str, dict[int, dict[str, Any]]]
) -> int:
    """Points the promotions between two snapshots sent: each attempt sends its epoch whole."""
    sent = 0
    for sink in SINKS:
        for epoch, row in after[sink].items():
            earlier = before[sink].get(epoch, {"promote_attempts": 0})["promote_attempts"]
            sent += row["points"] * (row["promote_attempts"] - earlier)
    return sent


def error_line(job: Job) -> str:
    """The job's one-line explanation of why it failed (``session_metrics: error: ...``)."""
    lines = [line for line in job.stderr().splitlines() if line.startswith("session_metrics:")]
    assert len(lines) == 1, job.tail()
    return lines[0]


def pending(url: str, sink: str = SINK) -> list[int]:
    rows = query(
        url,
        "SELECT epoch FROM twophase_epochs WHERE sink_id = %s AND state = 'PRECOMMITTED'"
        " ORDER BY epoch",
        sink,
    )
    return [int(row[0]) for row in rows]


def runs(url: str, sink: str = SINK) -> int:
    """How many runs (query starts) claimed the sink."""
    return int(query(url, "SELECT count(*) FROM twophase_runs WHERE sink_id = %s", sink)[0][0])


# --- replays cost InfluxDB nothing ---------------------------------------------------------


@pytest.mark.full  # replays are detected and skipped in the default run's kill tests too
def test_replays_cost_influxdb_nothing(
    staging_url: str, own_influx: InfluxServer, work: Path, event_files: list[Path]
) -> None:
    direct = Target(staging_url, influx_at(own_influx.url))  # checks read InfluxDB itself
    plan = work / "crash-plan.json"
    inputs = Inputs(work, event_files)
    with FaultProxy.for_url(own_influx.url) as proxy:  # pass mode: forwards and counts
        via_proxy = Target(staging_url, influx_at(proxy.url))
        # 1. Killed mid-promote of the first epoch, after two requests of up to five
        # points reached InfluxDB (armed and fed before the start: saves a micro-batch).
        arm(plan, "promote_batch:2", sink=SINK)
        inputs.feed()
        job = start(via_proxy, work, crash_plan=plan)
        killed_by_crash_point(job, plan)
        cut = pending(staging_url)
        assert len(cut) == 1, sink_epochs(staging_url)[SINK]
        cut_points = by_epoch(epochs(staging_url, SINK))[cut[0]]["points"]
        # two requests of at most five points (whole staged chunks, or cuts of one), and
        # at most one more from each other lane, under way when the kill came
        most = 5 * (2 + default("promote_connections") - 1)
        assert 2 <= proxy.lines <= min(most, cut_points - 1), (proxy.lines, cut_points)
        disarm(plan)
        job = start(via_proxy, work, crash_plan=plan)
        wait_exact(job, direct, inputs.fed, MALFORMED, EXACT_TIMEOUT_S)
        recovered = by_epoch(epochs(staging_url, SINK))[cut[0]]
        assert recovered["state"] == "COMMITTED", recovered
        assert recovered["promote_attempts"] == 2, recovered  # cut once, then whole
        assert recovered["replays"] >= 1, recovered  # Spark re-ran it: detected

        # 2. Killed right after an epoch was marked COMMITTED, before Spark logged it:
        # the restart replays it, then decides the input fed while the job was down.
        wait_idle(job, staging_url, SINK, EXACT_TIMEOUT_S)
        arm(plan, "after_mark:1", sink=SINK)
        inputs.feed()
        killed_by_crash_point(job, plan)
        at_crash = sink_epochs(staging_url)
        assert pending(staging_url) == [], at_crash[SINK]
        marked = max(at_crash[SINK])
        assert at_crash[SINK][marked]["points"] > 0, at_crash[SINK]  # a data epoch
        inputs.feed()
        sent_before = proxy.lines
        disarm(plan)
        job = start(via_proxy, work, crash_plan=plan)
        wait_exact(job, direct, inputs.fed, MALFORMED, EXACT_TIMEOUT_S)
        after = sink_epochs(staging_url)
        sent_on_restart = proxy.lines - sent_before
        replayed = after[SINK][marked]
        assert replayed["replays"] >= 1, replayed  # Spark re-ran it: detected
        assert replayed["promote_attempts"] == 1, replayed  # and not promoted again
        new_epochs = sorted(set(after[SINK]) - set(at_crash[SINK]))
        assert new_epochs, after[SINK]
        new_points = promotion_sends(at_crash, after)
        assert new_points == sum(after[SINK][e]["points"] for e in new_epochs)
        # Every point of the new epochs passed the proxy at least once (they are
        # COMMITTED), so a replay that sent anything would show up here.
        assert sent_on_restart <= new_points, (
            f"the restart sent {sent_on_restart} lines; its new epochs {new_epochs} have "
            f"{new_points} points; the replayed COMMITTED epoch {marked} has "
            f"{replayed['points']}"
        )
        job.kill()
        print(
            f"restart after the kill at after_mark: replayed epoch {marked} "
            f"({replayed['points']} points) and new epochs {new_epochs} ({new_points} "
            f"points): {sent_on_restart} lines sent"
        )

        influx_received_only_decided_points(staging_url, proxy)


def influx_received_only_decided_points(staging_url: str, proxy: FaultProxy) -> None:
    """The whole run: InfluxDB received at most the points decided plus, per promotion
    cut by a kill, its epoch once more (recovery re-sends an epoch whole)."""
    final = sink_epochs(staging_url)
    rows = [row for sink in SINKS for row in final[sink].values()]
    assert {row["state"] for row in rows} == {"COMMITTED"}
    decided = sum(row["points"] for row in rows)
    cut_resent = sum(row["points"] * (row["promote_attempts"] - 1) for row in rows)
    assert cut_resent > 0  # the first kill did cut a promotion
    assert decided <= proxy.lines <= decided + cut_resent, (proxy.lines, decided, cut_resent)
    print(
        f"InfluxDB received {proxy.lines} lines in {proxy.write_requests} requests: "
        f"{decided} points decided in {len(rows)} epochs, {cut_resent} in cut promotions"
    )


# --- InfluxDB outages -------------------------------------------------------------------------


def test_influx_outages_past_and_within_the_retry_deadline(
    staging_url: str, own_influx: InfluxServer, work: Path, event_files: list[Path]
) -> None:
    """One chain, to start Spark twice rather than three times: a job whose retry
    deadline is shorter than an outage fails with a clear error; its restart (with a
    deadline longer than the next outage) recovers the stuck epoch, then rides out
    InfluxDB stopped for a minute without a restart."""
    target = Target(staging_url, influx_at(own_influx.url))
    inputs = Inputs(work, event_files)
    stuck = outage_past_the_deadline_fails_the_query(target, own_influx, work, inputs)
    own_influx.start()
    job = start(
        target,
        work,
        TWOPHASE_TARGET_RETRY_DEADLINE=LONG_DEADLINE,
        TWOPHASE_TARGET_RETRY_MAX=RETRY_MAX,
    )
    wait_exact(job, target, inputs.fed, MALFORMED, EXACT_TIMEOUT_S)
    row = by_epoch(epochs(staging_url, SINK))[stuck]
    assert row["state"] == "COMMITTED", row  # recovered from its original writes
    assert row["promote_attempts"] == 2 and row["replays"] >= 1, row
    job_rides_out_a_minute_without_influx(job, target, own_influx, inputs)


def outage_past_the_deadline_fails_the_query(
    target: Target, own_influx: InfluxServer, work: Path, inputs: Inputs
) -> int:
    """InfluxDB stops; the promotion gives up after its deadline (5 s), the query fails
    with TargetUnavailableError, the job exits 1; the epoch stays PRECOMMITTED."""
    url = target.staging_url
    job = start(
        target,
        work,
        TWOPHASE_TARGET_RETRY_DEADLINE=SHORT_DEADLINE,
        TWOPHASE_TARGET_RETRY_MAX=RETRY_MAX,
    )
    inputs.feed()
    wait_exact(job, target, inputs.fed, MALFORMED, EXACT_TIMEOUT_S)
    own_influx.stop()
    inputs.feed()
    code = job.wait(KILL_TIMEOUT_S)
    kill_session(job.proc.pid)
    assert code == 1, job.tail()
    error = error_line(job)
    assert error.startswith(
        "session_metrics: error: TargetUnavailableError: target still unavailable after"
    ), error
    assert f"{SHORT_DEADLINE} without progress" in error, error
    assert f"InfluxDB at {own_influx.url}: cannot connect" in error, error  # says which
    stuck = pending(url)
    assert len(stuck) == 1, epochs(url, SINK)
    assert by_epoch(epochs(url, SINK))[stuck[0]]["promote_attempts"] == 1
    last_error = query(
        url,
        "SELECT last_error FROM twophase_epochs WHERE sink_id = %s AND epoch = %s",
        SINK,
        stuck[0],
    )[0][0]
    assert "TargetUnavailableError" in (last_error or ""), last_error
    return stuck[0]


def job_rides_out_a_minute_without_influx(
    job: Job, target: Target, own_influx: InfluxServer, inputs: Inputs
) -> None:
    """InfluxDB stopped for 60 s while new input arrives: the epoch is decided and its
    promotion keeps retrying; once InfluxDB is back the same driver finishes it."""
    url = target.staging_url
    driver = job.proc.pid
    runs_before = {sink: runs(url, sink) for sink in SINKS}
    retries_before = job.stderr().count("retrying in")
    own_influx.stop()
    down_since = time.monotonic()
    inputs.feed()
    # Wait for a promotion that is retrying, not merely for a decided epoch: an epoch
    # with nothing to send (a no-data batch after the watermark moved) is PRECOMMITTED
    # for a moment and then COMMITTED without InfluxDB.
    job.wait_for(
        "a promotion retrying while InfluxDB is down",
        lambda: job.stderr().count("retrying in") > retries_before,
        OUTAGE_S,
    )
    waiting = pending(url)
    assert len(waiting) == 1, waiting  # the driver promotes one epoch at a time
    while time.monotonic() - down_since < OUTAGE_S:
        assert job.returncode is None, job.tail()
        time.sleep(1.0)
    assert pending(url) == waiting  # still promoting: retried the whole minute
    retries = job.stderr().count("retrying in") - retries_before
    assert retries >= 10, job.tail()  # about two a second (backoff capped at 1 s, jittered)
    own_influx.start()
    back_at = time.monotonic()

    wait_exact(job, target, inputs.fed, MALFORMED, EXACT_TIMEOUT_S)
    caught_up_s = time.monotonic() - back_at
    assert job.returncode is None and job.proc.pid == driver, job.tail()
    assert {sink: runs(url, sink) for sink in SINKS} == runs_before  # never restarted
    assert len(job.records("STARTED")) == 1  # one query feeds both sinks
    for epoch in waiting:  # the same promotion call waited and finished it
        row = by_epoch(epochs(url, SINK))[epoch]
        assert row["state"] == "COMMITTED", row
        assert row["promote_attempts"] == 1 and row["replays"] == 0, row
    assert all(e["state"] == "COMMITTED" for s in SINKS for e in epochs(url, s))
    print(f"InfluxDB down {OUTAGE_S:g}s; exact {caught_up_s:.1f}s after it came back")
    job.kill()
