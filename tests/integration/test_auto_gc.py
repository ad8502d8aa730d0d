"""Automatic GC: the committing process collects its sink by itself, when due, on a thread
of its own, a bounded amount at a time, never in a commit's way; and a replay's new writes
that cannot be discarded are left to it without failing the commit."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

from tests.fakes import FakeClock
from tests.integration.cli_helpers import sql
from tests.staging import INTERVAL_S, STAGED_POINTS, committer_of, lines, scalar, stage
from tests.support import admin_conninfo, begin_run, staging_config_for, two_phase
from twophase.config import TargetConfig
from twophase.model import EpochState
from twophase.protocol.commit.runtime import TwoPhase

PURGED = (
    "SELECT COALESCE(array_agg(epoch ORDER BY epoch), '{}') FROM twophase_epochs"
    " WHERE purged_at IS NOT NULL"
)
WRITES = "SELECT count(*) FROM twophase_writes"
# Lock requests of the test's database that wait: the collection stuck behind the test's lock.
WAITING = (
    "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
    " WHERE NOT l.granted AND a.datname = current_database()"
)


@pytest.fixture
def expiring(staging_url: str, influx: TargetConfig) -> Iterator[TwoPhase]:
    """The parts over a store whose ended epochs expire at once (retention 0)."""
    with two_phase(staging_config_for(staging_url, retention="0s"), influx) as tp:
        yield tp


def wait_until(what: str, done: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_expired_epochs_and_orphans_go_without_an_operator(
    staging_url: str, influx: TargetConfig
) -> None:
    staging = staging_config_for(staging_url, retention="0s", gc_interval="200ms")
    with two_phase(staging, influx) as tp:
        lease = begin_run(tp, "s", "r1", "q1")
        loser = stage(tp, "s", 0, [lines(0, 3)], attempt=1)  # a speculative attempt
        tp.committer.commit(lease, 0, stage(tp, "s", 0, [lines(0, 3)]))
        assert not tp.auto_gc.running  # the first commit only starts the interval
        time.sleep(0.3)
        tp.committer.commit(lease, 1, stage(tp, "s", 1, [lines(1, 3)]))  # due: collects
        assert tp.auto_gc.wait(30)
        assert scalar(staging_url, PURGED) == [0, 1]
        assert scalar(staging_url, STAGED_POINTS) == 0
        assert scalar(staging_url, "SELECT staged_bytes FROM twophase_sinks") == 0
        gone = "SELECT count(*) FROM twophase_writes WHERE write_id::text = %s"
        assert scalar(staging_url, gone, loser[0].write_id) == 0


def test_one_collection_is_bounded_and_the_next_goes_on(expiring: Any, staging_url: str) -> None:
    clock = FakeClock(0.0)
    committer, auto = committer_of(expiring, clock, limit=2)
    try:
        lease = begin_run(expiring, "s", "r1", "q1")
        for epoch in range(5):
            stage(expiring, "s", epoch, [lines(epoch, 2)], attempt=1)  # orphans once decided
            committer.commit(lease, epoch, stage(expiring, "s", epoch, [lines(epoch, 2)]))
        assert scalar(staging_url, PURGED) == []  # not due within the interval
        clock.sleep(INTERVAL_S)
        committer.commit(lease, 5, stage(expiring, "s", 5, [lines(5, 2)]))
        assert auto.wait(30)
        assert scalar(staging_url, PURGED) == [0, 1]  # 6 expired, 2 purged
        assert scalar(staging_url, WRITES) == 6 + 3  # 5 orphans, 2 removed
        # It stopped at its bound: the next commit goes on, without waiting an interval.
        committer.commit(lease, 6, stage(expiring, "s", 6, [lines(6, 2)]))
        assert auto.wait(30)
        assert scalar(staging_url, PURGED) == [0, 1, 2, 3]
        assert scalar(staging_url, WRITES) == 7 + 1
    finally:
        committer.close()


def test_a_commit_does_not_wait_for_a_collection(expiring: Any, staging_url: str) -> None:
    clock = FakeClock(0.0)
    committer, auto = committer_of(expiring, clock, limit=100)
    lease = begin_run(expiring, "s", "r1", "q1")
    committer.commit(lease, 0, stage(expiring, "s", 0, [lines(0, 5)]))
    pool = ThreadPoolExecutor(1)
    try:
        with psycopg.connect(admin_conninfo(staging_url)) as blocker:
            # Another session holds epoch 0's staged chunks: purging it must wait.
            blocker.execute(
                "SELECT 1 FROM twophase_staged_chunks c JOIN twophase_epochs e"
                " ON c.write_id = ANY(e.write_ids) WHERE e.epoch = 0 FOR UPDATE OF c"
            )
            clock.sleep(INTERVAL_S)
            committer.commit(lease, 1, stage(expiring, "s", 1, [lines(1, 5)]))  # starts one
            wait_until("the collection to wait on the lock", lambda: scalar(staging_url, WAITING))
            clock.sleep(INTERVAL_S)
            messages = stage(expiring, "s", 2, [lines(2, 5)])
            outcome = pool.submit(committer.commit, lease, 2, messages).result(timeout=30)
            assert outcome.state == EpochState.COMMITTED
            assert auto.running  # still waiting: the commit went past it
            assert not auto.poke("s")  # due, but never two collections at once
            blocker.rollback()
        assert auto.wait(30)
        assert scalar(staging_url, PURGED) == [0, 1]  # what had expired when it started
    finally:
        pool.shutdown()
        committer.close()


def test_gc_interval_0_never_collects(staging_url: str, influx: TargetConfig) -> None:
    staging = staging_config_for(staging_url, retention="0s", gc_interval="0s")
    with two_phase(staging, influx) as tp:
        lease = begin_run(tp, "s", "r1", "q1")
        for epoch in range(3):
            tp.committer.commit(lease, epoch, stage(tp, "s", epoch, [lines(epoch, 3)]))
            time.sleep(0.05)
        assert not tp.auto_gc.poke("s")
        assert not tp.auto_gc.running
    assert scalar(staging_url, PURGED) == []
    assert scalar(staging_url, STAGED_POINTS) == 9


def test_a_failing_discard_leaves_the_replay_to_gc(
    tp: TwoPhase, staging_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    lease = begin_run(tp, "s", "r1", "q1")
    tp.committer.commit(lease, 0, stage(tp, "s", 0, [lines(0, 5)]))
    sql(
        staging_url,
        "CREATE FUNCTION refuse_delete() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN RAISE EXCEPTION 'writes cannot be deleted now'; END $$",
    )
    sql(
        staging_url,
        "CREATE TRIGGER refuse_delete BEFORE DELETE ON twophase_writes"
        " FOR EACH ROW EXECUTE FUNCTION refuse_delete()",
    )
    replayed = stage(tp, "s", 0, [lines(0, 5)])  # Spark runs epoch 0 again
    with caplog.at_level(logging.WARNING, logger="twophase.protocol.committer"):
        outcome = tp.committer.commit(lease, 0, replayed)
    assert (outcome.state, outcome.replay) == (EpochState.COMMITTED, True)
    assert "left to gc" in caplog.text and "writes cannot be deleted now" in caplog.text
    assert scalar(staging_url, WRITES) == 2  # the replay's write stays, an orphan
    tp.committer.commit(lease, 1, stage(tp, "s", 1, [lines(1, 5)]))  # the sink goes on

    sql(staging_url, "DROP TRIGGER refuse_delete ON twophase_writes")
    assert tp.gc.collect("s").orphan_writes == 1
    assert scalar(staging_url, WRITES) == 2  # epochs 0 and 1
