"""The staging store's outages ridden out: PostgreSQL restarted (fast, immediate) or a
connection terminated while a step is under way; the step is repeated, the result exact."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from scripts.services import PostgresServer
from tests.integration.test_protocol import M, lines, stage
from tests.support import admin_conninfo, alembic, free_port, influx_count, two_phase, unique
from twophase.config import InfluxConfig, StagingConfig, load_staging_config
from twophase.errors import StagingDeadlineError, StagingUnavailableError
from twophase.model import EpochState
from twophase.store.database import Database

SINK = "outage"
# Short connection timeouts so a step notices the outage quickly; a deadline well
# above a restart's few seconds.
SETTINGS = {"staging_connect_timeout": "2s", "staging_retry_deadline": "60s"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    pg = PostgresServer(tmp_path_factory.mktemp("pg") / "pg", free_port())
    pg.start()
    yield pg
    pg.destroy()


@pytest.fixture
def staging(server: PostgresServer) -> StagingConfig:
    name = unique("outage")
    server.create_database(name)
    url = server.url_for(name)
    assert alembic("upgrade", "head", url=url).returncode == 0
    return load_staging_config(env={}, staging_url=url, **SETTINGS)


def backend_waiting_for_lock(url: str) -> bool:
    with psycopg.connect(admin_conninfo(url)) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock'"
        ).fetchone()
    return bool(row and row[0])


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@contextmanager
def sink_locked(url: str, sink_id: str) -> Iterator[psycopg.Connection[Any]]:
    """Hold the sink's row lock from another connection: a decide of the sink waits."""
    conn = psycopg.connect(admin_conninfo(url))
    try:
        conn.execute("SELECT 1 FROM twophase_sinks WHERE sink_id = %s FOR UPDATE", (sink_id,))
        yield conn
    finally:
        conn.close()


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = call()
        except BaseException as exc:  # handed to the test's thread
            box["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, box


def replays(url: str, sink_id: str) -> int:
    with psycopg.connect(admin_conninfo(url)) as conn:
        row = conn.execute(
            "SELECT replays_detected FROM twophase_sinks WHERE sink_id = %s", (sink_id,)
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_a_restart_while_the_driver_decides_is_ridden_out(
    server: PostgresServer,
    staging: StagingConfig,
    influx: InfluxConfig,
    mode: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="twophase.retry")
    url = staging.url.reveal()
    with two_phase(staging, influx) as tp:
        lease = tp.ledger.begin_run(SINK, "r1", "q1")
        tp.committer.commit(lease, 0, stage(tp, SINK, 0, [lines(0, 10)]))
        messages = stage(tp, SINK, 1, [lines(1, 30), lines(1, 20, host="b")])
        with sink_locked(url, SINK):
            thread, box = in_thread(lambda: tp.committer.commit(lease, 1, messages))
            wait_for(lambda: backend_waiting_for_lock(url))  # decide is under way
            server.stop(mode=mode)  # ends the decide's transaction and the lock's
        server.start()
        thread.join(120)
        assert "error" not in box, box.get("error")
        assert box["result"].state == EpochState.COMMITTED and not box["result"].replay
        assert tp.ledger.pending(SINK) == []
    assert influx_count(influx, M) == 60
    assert replays(url, SINK) == 0
    assert any("decide failed (attempt 1)" in r.getMessage() for r in caplog.records)


def test_a_terminated_connection_while_deciding_is_ridden_out(
    staging: StagingConfig, influx: InfluxConfig
) -> None:
    url = staging.url.reveal()
    with two_phase(staging, influx) as tp:
        lease = tp.ledger.begin_run(SINK, "r1", "q1")
        messages = stage(tp, SINK, 0, [lines(0, 25)])
        with sink_locked(url, SINK) as locker:
            thread, box = in_thread(lambda: tp.committer.commit(lease, 0, messages))
            wait_for(lambda: backend_waiting_for_lock(url))
            ended = locker.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()
            assert ended and ended[0] >= 1  # the decide's backend and the pool's idle ones
        thread.join(120)
        assert "error" not in box, box.get("error")
        assert box["result"].state == EpochState.COMMITTED
    assert influx_count(influx, M) == 25
    assert replays(url, SINK) == 0


class AckLost(Database):
    """The real store, but the next transaction's commit is "not acknowledged": it
    commits, then the caller sees the connection fail (as when the server or the
    network goes away between COMMIT and its answer)."""

    lose_next = False

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Cursor[Any]]:
        with super().transaction() as cur:
            yield cur
        if self.lose_next:
            self.lose_next = False
            raise StagingUnavailableError("connection lost before COMMIT was acknowledged")


def test_a_decide_whose_commit_landed_is_read_back_not_counted_as_a_replay(
    staging: StagingConfig, influx: InfluxConfig
) -> None:
    url = staging.url.reveal()
    db = AckLost(staging)
    with two_phase(staging, influx, db=db) as tp:
        lease = tp.ledger.begin_run(SINK, "r1", "q1")
        messages = stage(tp, SINK, 0, [lines(0, 40)])
        db.lose_next = True
        decision = tp.ledger.decide(lease, 0, messages, start_promotion=True)
        assert not db.lose_next  # the first attempt committed, and its answer was lost
        assert (decision.state, decision.replay) == (EpochState.PRECOMMITTED, False)
        assert decision.plan is not None and decision.points_staged == 40
        tp.promoter.promote(lease, 0, decision.plan)
        # A real replay (new writes for the decided epoch) is still told apart.
        again = tp.ledger.decide(lease, 0, stage(tp, SINK, 0, [lines(0, 40)], attempt=1))
        assert (again.state, again.replay) == (EpochState.COMMITTED, True)
    assert influx_count(influx, M) == 40
    assert replays(url, SINK) == 1


def test_staging_waits_for_a_store_that_is_down_before_it_reads_its_input(
    server: PostgresServer, staging: StagingConfig, influx: InfluxConfig
) -> None:
    with two_phase(staging, influx) as tp:
        lease = tp.ledger.begin_run(SINK, "r1", "q1")
        server.stop(mode="immediate")
        restarter = threading.Timer(3.0, server.start)
        restarter.start()
        started = time.monotonic()
        messages = stage(tp, SINK, 0, [lines(0, 15)])  # waits for the store
        assert time.monotonic() - started >= 2.0
        restarter.join()
        assert tp.committer.commit(lease, 0, messages).state == EpochState.COMMITTED
    assert influx_count(influx, M) == 15


def test_staging_cut_mid_copy_fails_at_once_and_leaves_nothing(
    server: PostgresServer, staging: StagingConfig, influx: InfluxConfig
) -> None:
    """Input already read cannot be read again: the task fails (Spark re-runs it,
    reading its input again), and nothing of the cut attempt stays staged."""

    def rows_then_outage() -> Iterator[str]:
        yield from lines(0, 10)
        server.stop(mode="fast")  # while the COPY is open
        yield from lines(0, 10)[5:]

    with two_phase(staging, influx) as tp:
        with pytest.raises(StagingUnavailableError):
            tp.stager.stage(SINK, 0, rows_then_outage(), run_id="r1", query_id="q1")
        server.start()
        with psycopg.connect(admin_conninfo(staging.url.reveal())) as conn:
            assert conn.execute("SELECT count(*) FROM twophase_writes").fetchone() == (0,)


def test_past_the_deadline_a_step_fails_retryable_and_a_restart_recovers(
    server: PostgresServer, staging: StagingConfig, influx: InfluxConfig, tmp_path: Path
) -> None:
    short = load_staging_config(
        env={}, staging_url=staging.url.reveal(), **{**SETTINGS, "staging_retry_deadline": "3s"}
    )
    with two_phase(short, influx) as tp:
        lease = tp.ledger.begin_run(SINK, "r1", "q1")
        messages = stage(tp, SINK, 0, [lines(0, 12)])
        server.stop(mode="immediate")
        started = time.monotonic()
        with pytest.raises(StagingDeadlineError, match="staging_retry_deadline 3s"):
            tp.committer.commit(lease, 0, messages)
        assert time.monotonic() - started < 20
        server.start()
    with two_phase(short, influx) as tp:  # a restart: a new run recovers and decides
        lease = tp.ledger.begin_run(SINK, "r2", "q1")
        tp.committer.recover(lease)
        assert tp.committer.commit(lease, 0, messages).state == EpochState.COMMITTED
    assert influx_count(influx, M) == 12
