"""Recovery at the claim: a run that starts promotes what older runs left PRECOMMITTED,
without any commit (an available-now query with no new input, a quiet stream), under
its new lease (I5), in order (I3), one recovery of a sink at a time across processes."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from devkit import InfluxServer
from tests.staging import M, epoch_row, lines, stage
from tests.support import OWN_INFLUX_DB, admin_conninfo, begin_run, influx_count, two_phase
from twophase.config import BACKGROUND, INLINE, InfluxDBSettings, StagingConfig, TargetConfig
from twophase.errors import FencedError, TargetUnavailableError
from twophase.points.builder import Rejected
from twophase.protocol.commit.runtime import TwoPhase
from twophase.spark import claim_query, driver_commit
from twophase.spark.options import SinkOptions, parse_options

pytestmark = pytest.mark.timeout(120)


def committed_by(staging_url: str, sink: str) -> dict[int, str]:
    """Epoch -> the run whose mark made it COMMITTED (its history's ``committed`` event)."""
    with psycopg.connect(admin_conninfo(staging_url)) as conn:
        rows = conn.execute(
            "SELECT epoch, run_id FROM twophase_epoch_events WHERE sink_id = %s"
            " AND event = 'committed' ORDER BY id",
            (sink,),
        ).fetchall()
    return dict(rows)


def crashed_run(
    tp: TwoPhase, sink: str, epochs: range, run: str = "r1", rows: list[Any] | None = None
) -> None:
    """A run that decided ``epochs`` (30 points each, or ``rows``) and died before
    promoting them."""
    lease = begin_run(tp, sink, run, "q1")
    for epoch in epochs:
        part = lines(epoch, 30) if rows is None else rows
        tp.ledger.decide(lease, epoch, stage(tp, sink, epoch, [part], run=run))


@pytest.mark.parametrize("promotion", [INLINE, BACKGROUND])
def test_a_claim_promotes_what_an_older_run_left_without_any_commit(
    promotion: str, staging: StagingConfig, influx: TargetConfig, staging_url: str
) -> None:
    config = dataclasses.replace(influx, promotion=promotion)
    with two_phase(staging, config) as crashed:
        crashed_run(crashed, "s", range(2))
    with two_phase(staging, config) as restarted:  # the next start of the query
        lease = restarted.claim("s", "r2", "q1")
        # Promoted on the claiming thread, in order, before the claim returned: nothing
        # handed off, nothing left for a commit.
        assert restarted.ledger.pending("s") == []
        assert restarted.committer.drain() == []
        assert influx_count(config, M) == 60
        assert committed_by(staging_url, "s") == {0: "r2", 1: "r2"}  # the new lease's marks
        assert [epoch_row(staging_url, "s", e)["attempts"] for e in (0, 1)] == [1, 1]
        with pytest.raises(FencedError):  # the crashed run cannot take the sink back (I5)
            restarted.claim("s", "r1", "q1")
        assert restarted.claim("s", "r2", "q1") == lease  # the same run again: idempotent


def test_a_claim_leaves_the_epochs_of_its_own_run_to_its_commits(
    tp: TwoPhase, staging_url: str
) -> None:
    """A run's epoch may be promoting on another thread of it (background promotion), or
    in the commit of another of its processes: a second claim of the run must not send it
    beside them. The run's next commit recovers it, as before."""
    lease = tp.claim("s", "r1", "q1")
    tp.ledger.decide(lease, 0, stage(tp, "s", 0, [lines(0, 10)]))
    assert tp.claim("s", "r1", "q1") == lease
    assert tp.ledger.pending("s") == [0]
    assert epoch_row(staging_url, "s", 0)["attempts"] == 0
    outcome = tp.committer.commit(lease, 1, stage(tp, "s", 1, [lines(1, 10)]))
    assert outcome.recovered == (0,) and tp.ledger.pending("s") == []


def test_a_recovery_waits_for_the_one_under_way_and_sends_nothing_twice(
    tp: TwoPhase, staging: StagingConfig, influx: TargetConfig, staging_url: str
) -> None:
    """The claim of a query's start (on the driver) and the first commit of the same run
    (in a Python worker, for the data source) may both find an epoch pending: one sends
    it, the other waits for the sink's recovery lock, then finds nothing left."""
    crashed_run(tp, "s", range(1))
    claimed: list[Any] = []
    with two_phase(staging, influx) as driver:
        lease = begin_run(tp, "s", "r2", "q1")  # the worker's own claim: the same run
        with tp.ledger.recovering(lease):  # the worker's commit recovers first
            claim = threading.Thread(target=lambda: claimed.append(driver.claim("s", "r2", "q1")))
            claim.start()
            wait_until(lambda: lock_waiters(staging_url) == 1)
            tp.promoter.promote(lease, 0)
        claim.join(60)
    assert claimed == [lease]
    assert epoch_row(staging_url, "s", 0)["attempts"] == 1  # sent once
    assert influx_count(influx, M) == 30


def lock_waiters(staging_url: str) -> int:
    """Lock sessions (named for their run's fencing token) that hold no lock: each is
    trying to take one."""
    with psycopg.connect(admin_conninfo(staging_url)) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity a WHERE a.datname = current_database()"
            " AND a.application_name LIKE 'twophase fencing token %'"
            " AND NOT EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid"
            " AND l.locktype = 'advisory' AND l.granted)"
        ).fetchone()
    return int(row[0]) if row else 0


def wait_until(ready: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


# --- the Spark side: claim_query and the claim of a commit -----------------------------------


@dataclasses.dataclass(frozen=True)
class StartedQuery:
    """What claim_query reads of a started classic-Spark query."""

    id: str
    runId: str


@pytest.fixture
def spark_sinks(
    staging_url: str, influx: TargetConfig, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, str]]:
    """The data source's options of sink ``dash`` (its dead letters: ``dash.malformed``),
    in a driver process of their own (fresh per-process parts and leases)."""
    monkeypatch.setenv("TWOPHASE_STAGING_URL", staging_url)
    monkeypatch.setenv("TWOPHASE_TARGET_URL", influx.url)
    monkeypatch.setenv("TWOPHASE_INFLUX_API", "v1")
    monkeypatch.setenv("TWOPHASE_INFLUX_DB", str(influx.influxdb.database))
    monkeypatch.setattr(driver_commit, "_parts", {})
    monkeypatch.setattr(driver_commit, "_leases", {})
    yield {"sink_id": "dash", "measurement": M, "dead_letter_sink": "dash.malformed"}
    for parts in driver_commit._parts.values():
        parts.close()


def test_claim_query_recovers_both_sinks_of_a_query_that_has_no_batch_to_run(
    spark_sinks: dict[str, str], influx: TargetConfig, staging_url: str
) -> None:
    options = parse_options(spark_sinks)
    crashed_run(driver_commit.two_phase(options), "dash", range(3), run="run-1")
    dead = options.dead_letters()  # a row rejected upstream: a dead letter, no point
    rejected = [Rejected(0, "not valid JSON", "{")]
    crashed_run(driver_commit.two_phase(dead), dead.sink_id, range(1), run="run-1", rows=rejected)

    lease = claim_query(StartedQuery("q1", "run-2"), spark_sinks)
    assert lease.run_id == "run-2"
    for sink in ("dash", "dash.malformed"):
        assert driver_commit.two_phase(options).ledger.pending(sink) == []
    assert committed_by(staging_url, "dash") == {0: "run-2", 1: "run-2", 2: "run-2"}
    assert influx_count(influx, M) == 90


def test_a_foreach_batch_writers_empty_first_batch_recovers(
    spark_sinks: dict[str, str], influx: TargetConfig
) -> None:
    """A batch with nothing to decide still claims for its run, and the claim recovers."""
    options = parse_options({k: v for k, v in spark_sinks.items() if k != "dead_letter_sink"})
    crashed_run(driver_commit.two_phase(options), "dash", range(1), run="run-1")
    assert driver_commit.commit_epoch(options, 1, [], ("run-2", "q1")) is None
    assert driver_commit.two_phase(options).ledger.pending("dash") == []
    assert influx_count(influx, M) == 30


def test_a_claim_whose_recovery_fails_raises_and_the_next_claim_recovers(
    staging_url: str, own_influx: InfluxServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """InfluxDB down at the query's start: the claim fails as a commit's recovery does,
    after the retry deadline, the epoch left PRECOMMITTED; the run keeps the sink, and
    the next claim of it (its first commit, or a restart's) recovers."""
    monkeypatch.setenv("TWOPHASE_STAGING_URL", staging_url)
    monkeypatch.setenv("TWOPHASE_TARGET_URL", own_influx.url)
    monkeypatch.setenv("TWOPHASE_INFLUX_API", "v1")
    monkeypatch.setenv("TWOPHASE_INFLUX_DB", OWN_INFLUX_DB)
    monkeypatch.setattr(driver_commit, "_parts", {})
    monkeypatch.setattr(driver_commit, "_leases", {})
    retries = {"target_retry_deadline": "2s", "target_retry_initial": "0.1s"}
    sink: SinkOptions = parse_options({"sink_id": "dash", "measurement": M, **retries})
    try:
        parts = driver_commit.two_phase(sink)
        crashed_run(parts, "dash", range(1), run="run-1")
        own_influx.stop()
        with pytest.raises(TargetUnavailableError, match="still unavailable"):
            driver_commit.claim(sink, "run-2", "q1")
        assert parts.ledger.pending("dash") == [0]
        parts.ledger.check_lease(begin_run(parts, "dash", "run-2", "q1"))  # its own
        own_influx.start()
        driver_commit.claim(sink, "run-2", "q1")
        assert parts.ledger.pending("dash") == []
        assert (
            influx_count(
                TargetConfig(
                    url=own_influx.url, influxdb=InfluxDBSettings(api="v1", database=OWN_INFLUX_DB)
                ),
                M,
            )
            == 30
        )
    finally:
        for opened in driver_commit._parts.values():
            opened.close()


def test_a_commits_log_line_says_where_the_epochs_time_went(
    spark_sinks: dict[str, str], influx: TargetConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """Staging (as the foreachBatch writer timed it), recovery, the decision and the
    promotion, each in milliseconds, in the line and as ``steps_ms``."""
    options = parse_options({k: v for k, v in spark_sinks.items() if k != "dead_letter_sink"})
    messages = stage(driver_commit.two_phase(options), "dash", 0, [lines(0, 20)], run="run-1")
    with caplog.at_level("INFO", logger="twophase.spark"):
        outcome = driver_commit.commit_epoch(options, 0, messages, ("run-1", "q1"), staged_s=0.25)
    assert outcome is not None and [step for step, _ in outcome.steps] == [
        "recover",
        "decide",
        "promote",
    ]
    assert all(seconds >= 0 for _, seconds in outcome.steps)
    (record,) = [r for r in caplog.records if "points delivered" in r.getMessage()]
    assert "20 points delivered (stage 250 ms, recover " in record.getMessage()
    steps_ms = record.__dict__["steps_ms"]
    assert list(steps_ms) == ["stage", "recover", "decide", "promote"]
    assert steps_ms["stage"] == 250.0
    assert influx_count(influx, M) == 20
