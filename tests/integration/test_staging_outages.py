"""The staging store's outages ridden out: PostgreSQL restarted (fast, immediate) or a
connection terminated while a step is under way; the step is repeated, the result exact."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from devkit import PostgresServer
from devkit.ports import free_port
from tests.integration.requeue_helpers import (
    CONFLICTED,
    drop_conflicting,
    expected,
    held,
    rejected_store,
)
from tests.integration.requeue_helpers import SINK as RQ_SINK
from tests.staging import M, epoch_row, in_thread, lines, scalar, stage, terminate_others, wait_for
from tests.support import admin_conninfo, alembic, begin_run, influx_count, two_phase, unique
from twophase import faults
from twophase.config import StagingConfig, TargetConfig, load_staging_config
from twophase.errors import FencedError, StagingDeadlineError, StagingUnavailableError
from twophase.model import CommitMessage, EpochState, Lease
from twophase.operations.requeuer import EVERY_LETTER, Requeuer
from twophase.points.builder import Rejected
from twophase.protocol.stage import stager as stager_module
from twophase.protocol.stage.stager import Stager
from twophase.store.database import Database

SINK = "outage"
# Short connection timeouts so a step notices the outage quickly; a deadline well
# above a restart's few seconds.
SETTINGS = {"staging_connect_timeout": "2s", "staging_retry_deadline": "60s"}
PAUSE_S = 2.0  # a COPY paused at its crash point waits this long; its connection ends meanwhile


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


@contextmanager
def sink_locked(url: str, sink_id: str) -> Iterator[psycopg.Connection[Any]]:
    """Hold the sink's row lock from another connection: a decide of the sink waits."""
    conn = psycopg.connect(admin_conninfo(url))
    try:
        conn.execute("SELECT 1 FROM twophase_sinks WHERE sink_id = %s FOR UPDATE", (sink_id,))
        yield conn
    finally:
        conn.close()


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
    influx: TargetConfig,
    mode: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="twophase.retry")
    url = staging.url.reveal()
    with two_phase(staging, influx) as tp:
        lease = begin_run(tp, SINK, "r1", "q1")
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
    # The shutdown ends the backends in no set order: when the lock's ends first, the
    # decide's may commit before its own end, and the outage meets the promotion instead.
    retried = [r.getMessage() for r in caplog.records if "failed (attempt 1)" in r.getMessage()]
    assert retried and retried[0].startswith(("decide failed", "promote failed")), retried


def test_a_terminated_connection_while_deciding_is_ridden_out(
    staging: StagingConfig, influx: TargetConfig
) -> None:
    url = staging.url.reveal()
    with two_phase(staging, influx) as tp:
        lease = begin_run(tp, SINK, "r1", "q1")
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
    staging: StagingConfig, influx: TargetConfig
) -> None:
    url = staging.url.reveal()
    db = AckLost(staging)
    with two_phase(staging, influx, db=db) as tp:
        lease = begin_run(tp, SINK, "r1", "q1")
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


def landed_repeat(caplog: pytest.LogCaptureFixture, what: str) -> bool:
    """Whether step ``what`` failed once (the lost answer) and was repeated."""
    return any(f"{what} failed (attempt 1)" in r.getMessage() for r in caplog.records)


def events(url: str, sink_id: str, name: str, *, epoch: int | None = None, run: str = "") -> int:
    """How many ``name`` events the sink's history holds (of ``epoch``, of run ``run``)."""
    return int(
        scalar(
            url,
            "SELECT count(*) FROM twophase_epoch_events WHERE sink_id = %s AND event = %s"
            " AND (%s::bigint IS NULL OR epoch = %s) AND (%s = '' OR run_id = %s)",
            sink_id,
            name,
            epoch,
            epoch,
            run,
            run,
        )
    )


def test_a_mark_whose_commit_landed_is_repeated_not_counted_twice(
    staging: StagingConfig, influx: TargetConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """The mark's COMMIT lands, its answer is lost: the repeat finds the epoch COMMITTED
    and returns; the epoch is committed, and counted, once."""
    caplog.set_level(logging.WARNING, logger="twophase.retry")
    url = staging.url.reveal()
    db = AckLost(staging)
    with two_phase(staging, influx, db=db) as tp:
        lease = begin_run(tp, SINK, "r1", "q1")
        messages = stage(tp, SINK, 0, [lines(0, 30)])
        decision = tp.ledger.decide(lease, 0, messages, start_promotion=True)
        assert decision.plan is not None
        delivered, rejected = next(iter(tp.deliveries.values())).send(decision.plan)
        db.lose_next = True
        tp.ledger.mark_committed(lease, 0, delivered, rejected)
        assert not db.lose_next  # the first attempt committed, and its answer was lost
        assert tp.ledger.pending(SINK) == []
    assert (delivered, rejected) == (30, 0)
    assert landed_repeat(caplog, "mark")
    row = epoch_row(url, SINK, 0)
    assert (row["state"], row["delivered"], row["rejected_promote"]) == (
        EpochState.COMMITTED,
        30,
        0,
    )
    counted = "SELECT epochs_committed, points_delivered FROM twophase_sinks WHERE sink_id = %s"
    with psycopg.connect(admin_conninfo(url)) as conn:
        assert conn.execute(counted, (SINK,)).fetchone() == (1, 30)
    assert events(url, SINK, "committed", epoch=0) == 1
    assert influx_count(influx, M) == 30


def test_a_claim_whose_commit_landed_returns_the_lease_it_committed(
    staging: StagingConfig, influx: TargetConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """The claim's COMMIT lands, its answer is lost: the repeat finds the run owning the
    sink and returns its lease, with the token committed (grown once, not twice); the
    run decides and commits with it."""
    caplog.set_level(logging.WARNING, logger="twophase.retry")
    url = staging.url.reveal()
    db = AckLost(staging)
    with two_phase(staging, influx, db=db) as tp:
        older = begin_run(tp, SINK, "r0", "q1")
        db.lose_next = True
        lease = begin_run(tp, SINK, "r1", "q1")
        assert not db.lose_next  # the first attempt committed, and its answer was lost
        assert lease == Lease(SINK, "r1", "q1", older.token + 1)
        tokens = (
            "SELECT s.fencing_token, r.fencing_token FROM twophase_sinks s JOIN twophase_runs r"
            " ON r.sink_id = s.sink_id AND r.run_id = s.owner_run_id WHERE s.sink_id = %s"
        )
        with psycopg.connect(admin_conninfo(url)) as conn:
            assert conn.execute(tokens, (SINK,)).fetchone() == (lease.token, lease.token)
        decided = tp.committer.commit(lease, 0, stage(tp, SINK, 0, [lines(0, 20)]))
        assert (decided.state, decided.replay) == (EpochState.COMMITTED, False)
        with pytest.raises(FencedError):
            tp.ledger.check_lease(older)
    assert landed_repeat(caplog, "claim")
    assert events(url, SINK, "run_started", run="r1") == 1
    assert influx_count(influx, M) == 20


class LoseTheDecisionsAnswer(Stager):
    """Stages as the real one, then loses the answer of the next transaction's COMMIT:
    in a requeue, the decision's (the transaction that records the correction)."""

    def __init__(self, db: AckLost, config: StagingConfig) -> None:
        super().__init__(db, config)
        self._lossy = db

    def stage(self, *args: Any, **kwargs: Any) -> CommitMessage:
        message = super().stage(*args, **kwargs)
        self._lossy.lose_next = True
        return message


def test_a_requeue_whose_decision_landed_is_read_back_not_refused(
    staging: StagingConfig, influx: TargetConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """The COMMIT of the requeue's decision lands, its answer is lost: the repeat finds
    the correction recorded with the write it staged and returns it (not "another
    requeue ran meanwhile", not an error to the operator); each letter is requeued
    once, and InfluxDB holds each point once."""
    caplog.set_level(logging.WARNING, logger="twophase.retry")
    url = staging.url.reveal()
    db = AckLost(staging)
    with two_phase(staging, influx, db=db) as tp:
        rejected = rejected_store(tp, influx)  # promote-time dead letters: a type conflict
        drop_conflicting(influx)
        lease = tp.committer.claim(RQ_SINK, "requeue-1", None)
        requeuer = Requeuer(db, LoseTheDecisionsAnswer(db, staging))
        selection = requeuer.select(RQ_SINK, EVERY_LETTER)
        assert (selection.epoch, len(selection.ids)) == (-1, rejected)
        decision = requeuer.decide(lease, selection)
        assert not db.lose_next  # the decision committed, and its answer was lost
        assert (decision.epoch, decision.state, decision.replay) == (
            -1,
            EpochState.PRECOMMITTED,
            False,
        )
        assert decision.points_staged == rejected
        (promoted,) = tp.committer.recover(lease)
        assert (promoted.epoch, promoted.delivered, promoted.rejected) == (-1, rejected, 0)
    assert landed_repeat(caplog, "requeue")
    assert epoch_row(url, RQ_SINK, -1)["state"] == EpochState.COMMITTED
    assert events(url, RQ_SINK, "decided", epoch=-1) == 1
    assert events(url, RQ_SINK, "requeued", epoch=-1) == 1
    assert events(url, RQ_SINK, "committed", epoch=-1) == 1
    with psycopg.connect(admin_conninfo(url)) as conn:
        counted = conn.execute(
            "SELECT corrections, points_requeued FROM twophase_sinks WHERE sink_id = %s",
            (RQ_SINK,),
        ).fetchone()
        requeued = conn.execute(
            "SELECT epoch, requeued_in FROM twophase_dead_letters WHERE sink_id = %s",
            (RQ_SINK,),
        ).fetchall()
    assert counted == (1, rejected)
    assert len(requeued) == rejected  # the correction was delivered: no new dead letters
    assert all(epoch >= 0 and into == -1 for epoch, into in requeued)
    assert held(influx, CONFLICTED) == expected(CONFLICTED)


def test_staging_waits_for_a_store_that_is_down_before_it_reads_its_input(
    server: PostgresServer, staging: StagingConfig, influx: TargetConfig
) -> None:
    with two_phase(staging, influx) as tp:
        lease = begin_run(tp, SINK, "r1", "q1")
        server.stop(mode="immediate")
        restarter = threading.Timer(3.0, server.start)
        restarter.start()
        started = time.monotonic()
        messages = stage(tp, SINK, 0, [lines(0, 15)])  # waits for the store
        assert time.monotonic() - started >= 2.0
        restarter.join()
        assert tp.committer.commit(lease, 0, messages).state == EpochState.COMMITTED
    assert influx_count(influx, M) == 15


def pause_at(monkeypatch: pytest.MonkeyPatch, folder: Path, at: str) -> Path:
    """Arm crash point ``at`` of the sink to pause there; the marker it makes when it fires."""
    plan = folder / "plan.json"
    plan.write_text(json.dumps({"at": at, "sink": SINK, "pause_s": PAUSE_S}))
    monkeypatch.setenv(faults.PLAN_ENV, str(plan))
    monkeypatch.setattr(faults, "_hits", {})  # count this test's hits only
    return plan.with_name(plan.name + ".fired")


def open_files_in(folder: Path) -> list[str]:
    """This process's open files in ``folder`` (a spool's file has no name there)."""
    found = []
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith(str(folder)):
                found.append(target)
    return found


@contextmanager
def cut_when_paused(
    marker: Path, spool_dir: Path, cut: Callable[[], object]
) -> Iterator[dict[str, Any]]:
    """Once the paused COPY fires its crash point, note the spool's open files, then cut
    its connection with ``cut()``; what the cutting thread saw, once it has finished."""

    def cutting() -> dict[str, Any]:
        wait_for(marker.exists)
        spooled = open_files_in(spool_dir)
        return {"spooled": spooled, "cut": cut()}

    thread, box = in_thread(cutting)
    seen: dict[str, Any] = {}
    try:
        yield seen
    finally:
        thread.join(120)  # the server is back before anything else runs
    assert "error" not in box, box.get("error")
    seen.update(box["result"])


def staged_writes(url: str) -> list[tuple[Any, ...]]:
    """(write id, points, rejected, checksum, chunks, chunked points, dead letters) per write."""
    with psycopg.connect(admin_conninfo(url)) as conn:
        return conn.execute(
            "SELECT w.write_id::text, w.points, w.rejected, w.checksum,"
            " (SELECT count(*) FROM twophase_staged_chunks c WHERE c.write_id = w.write_id),"
            " (SELECT COALESCE(sum(points), 0) FROM twophase_staged_chunks c"
            "  WHERE c.write_id = w.write_id),"
            " (SELECT count(*) FROM twophase_dead_letters d WHERE d.write_id = w.write_id)"
            " FROM twophase_writes w WHERE w.sink_id = %s",
            (SINK,),
        ).fetchall()


def mixed(n: int) -> list[str | Rejected]:
    """``n`` lines of epoch 0, with a rejected row after line 0, 97, 194..."""
    items: list[str | Rejected] = []
    for index, line in enumerate(lines(0, n)):
        items.append(line)
        if index % 97 == 0:
            items.append(Rejected(len(items), "no fields", f'{{"row": {index}}}'))
    return items


def read_once(items: list[str | Rejected], box: dict[str, int]) -> Iterator[str | Rejected]:
    """``items`` as an input that can be read once (as Spark's rows), counting what it gives."""
    for item in items:
        box["given"] = box.get("given", 0) + 1
        yield item


def reference(staging: StagingConfig, influx: TargetConfig, items: list[str | Rejected]) -> Any:
    """The message of ``items`` staged without a fault (another sink: the checksum to expect)."""
    with two_phase(staging, influx) as tp:
        return Stager(tp.db, staging).stage("reference", 0, list(items))


def repeated(caplog: pytest.LogCaptureFixture, message: Any) -> bool:
    """Whether the staging of ``message``'s write failed once and was repeated."""
    failed = f"stage write {message.write_id} failed (attempt 1)"
    return any(failed in r.getMessage() for r in caplog.records)


def check_staged_once(url: str, message: Any, expected: Any) -> None:
    assert (message.points, message.rejected, message.checksum) == (
        expected.points,
        expected.rejected,
        expected.checksum,
    )
    ((write_id, points, rejected, checksum, _, chunked, letters),) = staged_writes(url)
    assert write_id == message.write_id
    assert (points, rejected, checksum) == (expected.points, expected.rejected, expected.checksum)
    assert (chunked, letters) == (expected.points, expected.rejected)


def restart(server: PostgresServer) -> None:
    server.stop(mode="fast")
    server.start()


@pytest.mark.parametrize(
    ("input_kind", "cut"),
    [("generator", "terminate"), ("list", "terminate"), ("generator", "restart")],
)
def test_a_copy_cut_mid_way_is_repeated_under_the_same_write_id(
    server: PostgresServer,
    staging: StagingConfig,
    influx: TargetConfig,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    input_kind: str,
    cut: str,
) -> None:
    """A connection ended (or PostgreSQL restarted) while the COPY runs: the same call
    stages again from what it spooled (a generator: its rows are not read again) or from
    its list, under the same write id; the write is staged once, whole, with the checksum
    of an uncut staging."""
    caplog.set_level(logging.WARNING, logger="twophase.retry")
    url = staging.url.reveal()
    config = replace(staging, chunk_points=100)
    items = mixed(2_000)
    expected = reference(config, influx, items)
    given: dict[str, int] = {}
    source = read_once(items, given) if input_kind == "generator" else items
    marker = pause_at(monkeypatch, tmp_path, "stage_rows:9")  # mid-COPY: 300 of 2,000 lines sent
    cutting = (lambda: terminate_others(url)) if cut == "terminate" else (lambda: restart(server))
    with two_phase(config, influx) as tp:
        lease = begin_run(tp, SINK, "r1", "q1")
        with cut_when_paused(marker, tmp_path, cutting):
            message = Stager(tp.db, config, spool_dir=str(tmp_path)).stage(
                SINK, 0, source, run_id="r1", query_id="q1"
            )
        check_staged_once(url, message, expected)
        assert tp.committer.commit(lease, 0, [message]).state == EpochState.COMMITTED
    assert repeated(caplog, message)
    assert given.get("given", len(items)) == len(items)  # each row read once
    assert influx_count(influx, M) == 2_000


def test_a_generator_past_the_memory_bound_is_repeated_from_the_spools_file(
    staging: StagingConfig,
    influx: TargetConfig,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With a spool of a few kilobytes, the chunks and rejected rows spill to a file (in the
    spool directory, without a name); the cut COPY is repeated from memory and file, the
    rows are read once, and the file is gone when the call returns."""
    caplog.set_level(logging.WARNING, logger="twophase.retry")
    url = staging.url.reveal()
    # 2,000 bytes: the chunks are gzip members of about 1 KB (100 lines each)
    config = replace(staging, chunk_points=100, spool_memory=2_000)
    items = mixed(3_000)
    expected = reference(config, influx, items)
    given: dict[str, int] = {}
    marker = pause_at(monkeypatch, tmp_path, "stage_rows:41")  # 1,400 of 3,000 lines sent
    with two_phase(config, influx) as tp:
        with cut_when_paused(marker, tmp_path, lambda: terminate_others(url)) as seen:
            message = Stager(tp.db, config, spool_dir=str(tmp_path)).stage(
                SINK, 0, read_once(items, given), run_id="r1", query_id="q1"
            )
        assert seen["spooled"], "nothing was spooled to a file while the COPY ran"
        assert open_files_in(tmp_path) == []  # closed with the call
        assert {p.name for p in tmp_path.iterdir()} == {"plan.json", "plan.json.fired"}
        check_staged_once(url, message, expected)
    assert repeated(caplog, message)
    assert given["given"] == len(items)


def test_a_list_is_repeated_without_a_spool(
    staging: StagingConfig,
    influx: TargetConfig,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A list (the rows a split kept, a requeue's lines) is in memory already: a repeat
    encodes it again, and nothing is spooled, whatever its size."""
    caplog.set_level(logging.WARNING, logger="twophase.retry")
    url = staging.url.reveal()
    config = replace(staging, chunk_points=100, spool_memory=0)
    items = mixed(2_000)
    expected = reference(config, influx, items)

    def no_spool(*args: object) -> None:
        raise AssertionError("a list input was spooled")

    monkeypatch.setattr(stager_module, "Spool", no_spool)
    marker = pause_at(monkeypatch, tmp_path, "stage_rows:9")
    with two_phase(config, influx) as tp:
        with cut_when_paused(marker, tmp_path, lambda: terminate_others(url)) as seen:
            message = Stager(tp.db, config, spool_dir=str(tmp_path)).stage(SINK, 0, items)
        assert seen["cut"] >= 1 and seen["spooled"] == []
        check_staged_once(url, message, expected)
    assert repeated(caplog, message)


@pytest.mark.parametrize("input_kind", ["generator", "list"])
def test_a_staging_whose_commit_landed_is_read_back_not_staged_twice(
    staging: StagingConfig,
    influx: TargetConfig,
    monkeypatch: pytest.MonkeyPatch,
    input_kind: str,
) -> None:
    """The COMMIT lands but its answer is lost: the repeat finds the write's row and
    returns the message the first attempt recorded; nothing is staged twice."""
    url = staging.url.reveal()
    recorded: list[Any] = []
    record_write = stager_module._record_write

    def recording(cur: Any, message: Any) -> None:
        recorded.append(message)
        record_write(cur, message)

    monkeypatch.setattr(stager_module, "_record_write", recording)
    items = mixed(1_000)
    db = AckLost(staging)
    with two_phase(staging, influx, db=db) as tp:
        db.lose_next = True
        source = iter(items) if input_kind == "generator" else items
        message = tp.stager.stage(SINK, 0, source, partition_id=2, run_id="r1", query_id="q1")
        assert not db.lose_next  # the first attempt committed, and its answer was lost
        assert recorded == [message]  # one attempt staged; the repeat read it back
        check_staged_once(url, message, message)
        assert (message.points, message.rejected, message.partition_id) == (1_000, 11, 2)
        lease = begin_run(tp, SINK, "r1", "q1")
        assert tp.committer.commit(lease, 0, [message]).state == EpochState.COMMITTED
    assert influx_count(influx, M) == 1_000


def test_a_write_id_found_staged_at_insert_is_read_back(
    staging: StagingConfig, influx: TargetConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An attempt whose write id is already staged (the cut attempt's COMMIT landed after
    the read-back looked) meets the primary key and returns the staged write's message."""
    url = staging.url.reveal()
    items = mixed(500)
    with two_phase(staging, influx) as tp:
        first = tp.stager.stage(SINK, 0, list(items), run_id="r1", query_id="q1")
        monkeypatch.setattr(
            "twophase.protocol.stage.stager.uuid.uuid4", lambda: uuid.UUID(first.write_id)
        )
        again = tp.stager.stage(SINK, 0, iter(items), run_id="r1", query_id="q1")
    assert again == first
    check_staged_once(url, again, first)


def test_past_the_deadline_a_step_fails_retryable_and_a_restart_recovers(
    server: PostgresServer, staging: StagingConfig, influx: TargetConfig, tmp_path: Path
) -> None:
    short = load_staging_config(
        env={}, staging_url=staging.url.reveal(), **{**SETTINGS, "staging_retry_deadline": "3s"}
    )
    with two_phase(short, influx) as tp:
        lease = begin_run(tp, SINK, "r1", "q1")
        messages = stage(tp, SINK, 0, [lines(0, 12)])
        server.stop(mode="immediate")
        started = time.monotonic()
        with pytest.raises(StagingDeadlineError, match="staging_retry_deadline 3s"):
            tp.committer.commit(lease, 0, messages)
        assert time.monotonic() - started < 20
        server.start()
    with two_phase(short, influx) as tp:  # a restart: a new run recovers and decides
        lease = begin_run(tp, SINK, "r2", "q1")
        tp.committer.recover(lease)
        assert tp.committer.commit(lease, 0, messages).state == EpochState.COMMITTED
    assert influx_count(influx, M) == 12
