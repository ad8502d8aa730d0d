"""Targets a sink can trust: the availability rule (I10) and the corners of several
targets that used to wedge a sink or lose a target's data, each on real servers.

Targets a and b are two databases of the test InfluxDB, each behind a fault proxy of
its own, so that either can be taken down."""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
from typing import Any

import psycopg
import pytest

from tests.integration.cli_helpers import sql
from tests.integration.fanout_helpers import (
    N,
    Targets,
    deliveries,
    expect,
    points,
    proxied_targets,
    target_rows,
    without_worker,
    write_points,
)
from tests.staging import M, lines, stage
from tests.support import (
    admin_conninfo,
    influx_count,
    influx_query,
    two_phase,
)
from twophase import operations as ops
from twophase.config import NamedTarget, StagingConfig, TargetConfig, TwoPhaseConfig
from twophase.errors import (
    FencedError,
    LockLostError,
    StateError,
    TargetOrderError,
    TargetUnavailableError,
    UsageError,
)
from twophase.model import EpochState, Lease
from twophase.operations.requeuer import RequeueFilter, Requeuer
from twophase.protocol.commit.runtime import TwoPhase
from twophase.protocol.maintain.gc import GarbageCollector
from twophase.store.database import Database

SINK = "avail"


def commit(tp: TwoPhase, lease: Lease, epoch: int) -> Any:
    messages = stage(tp, SINK, epoch, [points(epoch)], run=lease.run_id)
    return tp.committer.commit(lease, epoch, messages)


def epoch_state(url: str, epoch: int) -> str:
    return sql(url, "SELECT state FROM twophase_epochs WHERE epoch = %s", epoch)[0][0]


def full(staging: StagingConfig, influx: TargetConfig) -> TwoPhaseConfig:
    return TwoPhaseConfig(staging, influx)


# -- the availability rule --------------------------------------------------------------


def test_a_lagging_target_takes_the_sink_on_when_the_caught_up_one_is_down(
    staging: StagingConfig, two: Targets, staging_url: str
) -> None:
    """b lagging, then a down: the job stops; b back with a still down: the restarted
    job finishes on b alone; a back: recover catches it up; both exact."""
    with two_phase(staging, two.config) as tp:
        lease = tp.committer.claim(SINK, "r1", "q1")
        tp.catch_up.close()  # b's backlog is the availability rule's, not the worker's
        two.down("b")
        assert commit(tp, lease, 0).state == EpochState.COMMITTED  # in a alone
        two.down("a")
        with pytest.raises(TargetUnavailableError):
            commit(tp, lease, 1)  # neither target: the job stops
    assert epoch_state(staging_url, 1) == EpochState.PRECOMMITTED
    two.up("b")  # back, a still down
    with two_phase(staging, two.config) as tp:
        lease = tp.committer.claim(SINK, "r2", "q1")  # recovers 1: b caught up, then 1
        assert epoch_state(staging_url, 1) == EpochState.COMMITTED
        assert commit(tp, lease, 2).state == EpochState.COMMITTED  # b alone, a lagging
    expect(two.direct["b"], [0, 1, 2])
    assert deliveries(staging_url, SINK, "b") == [0, 1, 2]
    assert target_rows(staging_url, SINK)["a"]["state"] == "lagging"
    two.up("a")
    report = ops.recover(full(staging, two.config), SINK, guard=ops.Guard(force=True))
    assert [(c.target, c.epoch) for c in report.caught_up] == [("a", 1), ("a", 2)]
    for name in ("a", "b"):
        expect(two.direct[name], [0, 1, 2])
        assert target_rows(staging_url, SINK)[name]["state"] == "live"


def test_a_target_removed_from_the_configuration_does_not_hold_the_sink(
    staging: StagingConfig, two: Targets, staging_url: str
) -> None:
    """a down for good and taken out of the configuration: b, lagging, takes over."""
    with without_worker(staging, two.config, SINK) as (tp, lease):
        two.down("b")
        commit(tp, lease, 0)
        two.down("a")
        with pytest.raises(TargetUnavailableError):
            commit(tp, lease, 1)
    two.up("b")
    with two_phase(staging, two.with_targets("b")) as tp:
        lease = tp.committer.claim(SINK, "r2", "q1")
        assert commit(tp, lease, 2).state == EpochState.COMMITTED
    expect(two.direct["b"], [0, 1, 2])


def test_a_commit_reads_where_targets_stand_every_round(
    staging: StagingConfig, two: Targets, staging_url: str
) -> None:
    """a down and b lagging when a commit starts; b comes back while it retries: the
    commit catches b up and commits with it, instead of failing on its first list."""
    with two_phase(staging, two.with_targets("a", "b", retry_deadline_s=8)) as tp:
        lease = tp.committer.claim(SINK, "r1", "q1")
        tp.catch_up.close()
        two.down("b")
        commit(tp, lease, 0)
        two.down("a")
        timer = threading.Timer(2.5, two.up, args=("b",))
        timer.start()
        try:
            assert commit(tp, lease, 1).state == EpochState.COMMITTED
        finally:
            timer.cancel()
    assert deliveries(staging_url, SINK, "b") == [0, 1]
    expect(two.direct["b"], [0, 1])


def test_every_target_down_names_both_deadlines(staging: StagingConfig, two: Targets) -> None:
    with two_phase(staging, two.with_targets("a", "b", retry_deadline_s=2.5)) as tp:
        lease = tp.committer.claim(SINK, "r1", "q1")
        two.down("a", "b")
        with pytest.raises(TargetUnavailableError) as raised:
            commit(tp, lease, 0)
    message = str(raised.value)
    # The setting's former name or its current one (target_retry_deadline): both read.
    assert re.search(r"2\.5s \((influx|target)_retry_deadline\)", message)
    assert "target_deadline" in message
    assert "retry_deadline 1s" not in message  # the round's deadline is target_deadline


# -- resync, quarantine and the lag clock -----------------------------------------------


def quarantine_b(tp: TwoPhase, two: Targets, lease: Lease, epochs: int) -> None:
    tp.catch_up.close()
    two.down("b")
    for epoch in range(epochs):
        commit(tp, lease, epoch)
    strict = GarbageCollector(tp.db, 7 * 86400, 3600, max_lag_s=0.0)
    assert strict.collect(SINK).quarantined == ((SINK, "b"),)
    two.up("b")


def test_a_resync_restarts_the_lag_clock_and_ends_live_through_collections(
    staging: StagingConfig, two: Targets, staging_url: str
) -> None:
    """A quarantined target resynced while `twophase gc` runs from cron: the collections
    during the resync leave it alone, it ends live and exact, and stays live."""
    with two_phase(staging, two.config) as tp:
        lease = tp.committer.claim(SINK, "r1", "q1")
        quarantine_b(tp, two, lease, 3)
    config = full(staging, dataclasses.replace(two.config, target_max_lag_s=60))
    cron = GarbageCollector
    stop = threading.Event()
    quarantined: list[Any] = []

    def collect_from_cron() -> None:
        with Database(staging) as db:
            gc = cron(db, 7 * 86400, 3600, max_lag_s=1.0)  # older than 1 s: epochs are
            while not stop.is_set():
                quarantined.extend(gc.collect(SINK).quarantined)
                stop.wait(0.05)

    thread = threading.Thread(target=collect_from_cron)
    thread.start()
    try:
        time.sleep(1.2)  # the epochs b lacks are older than the cron's lag now
        report = ops.resync(config, SINK, "b", guard=ops.Guard(force=True))
    finally:
        stop.set()
        thread.join()
    assert report.state == "live" and report.delivered == (0, 1, 2)
    assert quarantined == []
    expect(two.direct["b"], [0, 1, 2])
    with Database(staging) as db:
        after = GarbageCollector(db, 7 * 86400, 3600, max_lag_s=0.0).collect(SINK)
    assert after.quarantined == ()
    assert target_rows(staging_url, SINK)["b"]["state"] == "live"


def test_a_quarantined_target_whose_backlog_is_delivered_is_live_again(
    staging: StagingConfig, two: Targets, staging_url: str
) -> None:
    with two_phase(staging, two.config) as tp:
        lease = tp.committer.claim(SINK, "r1", "q1")
        quarantine_b(tp, two, lease, 2)
        done = tp.catch_up.run(lease, ["b"], quarantined=True)
    assert done.delivered == (("b", 0), ("b", 1))
    expect(two.direct["b"], [0, 1])  # b read back: what the report says it was sent
    assert target_rows(staging_url, SINK)["b"]["state"] == "live"


def test_a_negative_from_epoch_is_refused(staging: StagingConfig, two: Targets) -> None:
    with two_phase(staging, two.config) as tp:
        lease = tp.committer.claim(SINK, "r1", "q1")
        with pytest.raises(ValueError, match="from_epoch"):
            tp.targets.restart(lease, SINK, "b", -1)
    with pytest.raises(UsageError, match="--from-epoch -1"):
        ops.resync(full(staging, two.config), SINK, "b", from_epoch=-1)


# -- a target's cursor ------------------------------------------------------------------


def test_a_late_delivery_record_never_moves_a_rewound_cursor(
    staging: StagingConfig, two: Targets, staging_url: str
) -> None:
    """A fenced run's in-flight record of epoch 3 lands after a resync rewound b to 1:
    refused, so epochs 1 and 2 are sent again rather than reported delivered."""
    with two_phase(staging, two.config) as tp:
        old = tp.committer.claim(SINK, "r1", "q1")
        for epoch in range(4):
            commit(tp, old, epoch)
        resync = tp.ledger.begin_run(SINK, "resync", None)
        assert tp.targets.restart(resync, SINK, "b", 1) == 1
        with pytest.raises(FencedError):
            tp.targets.delivered(old, "b", 3, (N + 1, 0))  # the fenced run's late record
        with pytest.raises(TargetOrderError):
            tp.targets.delivered(resync, "b", 3, (N + 1, 0))  # 1 and 2 come first
        assert target_rows(staging_url, SINK)["b"]["delivered"] == 0
        done = tp.catch_up.run(resync, ["b"], quarantined=True)
    assert done.delivered == (("b", 1), ("b", 2), ("b", 3))


def test_a_lost_target_lock_stops_the_delivery_before_its_next_request(
    staging: StagingConfig, two: Targets, staging_url: str
) -> None:
    """The session holding b's lock ends (a PostgreSQL restart, a cut connection): its
    holder stops before its next request and records nothing."""
    with without_worker(staging, two.config, SINK) as (tp, lease):
        two.down("b")
        commit(tp, lease, 0)
        two.up("b")
        writer = tp.writers["b"]
        sent = []

        def write_then_lose_the_lock(body: bytes, gzipped: bool = False) -> None:
            original(body, gzipped)
            sent.append(len(body))
            with psycopg.connect(admin_conninfo(staging_url)) as conn:
                conn.execute(  # the session of the only advisory lock held now: b's
                    "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'"
                    " AND granted AND database = (SELECT oid FROM pg_database"
                    " WHERE datname = current_database())"
                )

        original = writer.write
        writer.write = write_then_lose_the_lock  # type: ignore[method-assign]
        report = tp.catch_up.run(lease, ["b"])
    assert len(sent) == 1  # one request, then the lock was seen gone
    assert [type(e) for _, e in report.failed] == [LockLostError]
    assert deliveries(staging_url, SINK, "b") == []


def test_each_target_url_is_stored_without_credentials_and_a_change_reported(
    staging: StagingConfig, two: Targets, staging_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    secret = dataclasses.replace(
        two.config.targets[1].config,
        url=two.proxies["b"].url.replace("http://", "http://user:s3cret@"),
    )
    targets = (two.config.targets[0], NamedTarget("b", secret))
    with two_phase(staging, dataclasses.replace(two.config, targets=targets)) as tp:
        tp.committer.claim(SINK, "r1", "q1")
    stored = dict(sql(staging_url, "SELECT target, url FROM twophase_targets"))
    assert stored["b"] == two.proxies["b"].url  # http://127.0.0.1:PORT, nothing more
    moved = dataclasses.replace(two.config.targets[1].config, url=two.proxies["a"].url)
    targets = (two.config.targets[0], NamedTarget("b", moved))
    with (
        caplog.at_level(logging.WARNING),
        two_phase(staging, dataclasses.replace(two.config, targets=targets)) as tp,
    ):
        tp.committer.claim(SINK, "r2", "q1")
        states = {s.target: s for s in ops.target_states(staging, SINK)}
    assert states["b"].url == two.proxies["a"].url
    assert any("target b now points at" in r.getMessage() for r in caplog.records)
    events = sql(
        staging_url,
        "SELECT detail FROM twophase_epoch_events WHERE event = %s",
        "target_url_changed",
    )
    assert len(events) == 1 and "s3cret" not in events[0][0]


def test_operator_commands_never_create_targets(
    staging: StagingConfig, two: Targets, staging_url: str
) -> None:
    with two_phase(staging, two.config) as tp:
        lease = tp.committer.claim(SINK, "r1", "q1")
        commit(tp, lease, 0)
    typo = dataclasses.replace(
        two.config, targets=(*two.config.targets, NamedTarget("c", two.config.targets[0].config))
    )
    warnings: list[str] = []
    hooks = ops.Hooks(warn=warnings.append)
    ops.recover(full(staging, typo), SINK, guard=ops.Guard(force=True), hooks=hooks)
    ops.resend(full(staging, typo), SINK, guard=ops.Guard(force=True), hooks=hooks)
    assert set(target_rows(staging_url, SINK)) == {"a", "b"}
    assert any("target 'c'" in w for w in warnings)


def test_recover_catches_up_every_reachable_target_not_just_the_first(
    staging: StagingConfig, influx_url: str, staging_url: str
) -> None:
    with proxied_targets(influx_url, ("a", "b", "c")) as three:
        with two_phase(staging, three.config) as tp:
            lease = tp.committer.claim(SINK, "r1", "q1")
            tp.catch_up.close()
            three.down("a", "b")
            commit(tp, lease, 0)  # in c alone
        three.up("b")  # a, first in order, still down
        report = ops.recover(full(staging, three.config), SINK, guard=ops.Guard(force=True))
        assert [(c.target, c.epoch) for c in report.caught_up] == [("b", 0)]
        assert [s.target for s in report.still_behind] == ["a"]
        expect(three.direct["b"], [0])


# -- corrections ------------------------------------------------------------------------


def refused_by_b(tp: TwoPhase, two: Targets, lease: Lease) -> None:
    """Epoch 0, whose three "clash" points b refuses (a takes them): b's dead letters."""
    write_points(two.direct["b"], ['clash,host=z v="text" 1700000000000000001'])
    clash = [f"clash,host=h{i} v={i}.5 {1700000000000000000 + i}" for i in range(3)]
    messages = stage(tp, SINK, 0, [points(0) + clash], run=lease.run_id)
    tp.committer.commit(lease, 0, messages)


def test_a_correction_owed_to_a_target_that_is_down_blocks_no_other(
    staging: StagingConfig, two: Targets, staging_url: str
) -> None:
    with without_worker(staging, two.config, SINK) as (tp, lease):
        refused_by_b(tp, two, lease)
        influx_query(two.direct["b"], "DROP MEASUREMENT clash")
        two.down("b")
        requeuer = Requeuer(tp.db, tp.stager)
        requeuer.decide(lease, requeuer.select(SINK, RequeueFilter(target="b")))
        tp.committer.recover(lease)  # one round for b, then COMMITTED: in b's backlog
        assert epoch_state(staging_url, -1) == EpochState.COMMITTED
        assert commit(tp, lease, 1).state == EpochState.COMMITTED  # not held by -1
        assert deliveries(staging_url, SINK, "b") == [0]
        two.up("b")
        done = tp.catch_up.run(lease, ["b"])
    assert done.delivered == (("b", -1), ("b", 1))  # the correction first
    assert influx_count(two.direct["b"], "clash") == 3


def test_requeue_to_a_quarantined_or_unconfigured_target_is_refused(
    staging: StagingConfig, two: Targets, staging_url: str
) -> None:
    with without_worker(staging, two.config, SINK) as (tp, lease):
        refused_by_b(tp, two, lease)
        strict = GarbageCollector(tp.db, 7 * 86400, 3600, max_lag_s=0.0)
        two.down("b")
        commit(tp, lease, 1)
        strict.collect(SINK)
    chosen = RequeueFilter(target="b")
    with pytest.raises(StateError, match="quarantined"):
        ops.requeue(full(staging, two.config), SINK, chosen, guard=ops.Guard(force=True))
    with pytest.raises(StateError, match="does not name"):
        ops.requeue(full(staging, two.with_targets("a")), SINK, chosen, guard=ops.Guard(force=True))
    assert sql(staging_url, "SELECT count(*) FROM twophase_epochs WHERE epoch < 0") == [(0,)]


def test_an_untargeted_correction_is_in_every_targets_backlog_and_resync_resends_it(
    staging: StagingConfig, two: Targets, staging_url: str
) -> None:
    """Letters that name no target (from before targets were named) make a correction
    owed to every target: one that fails it catches it up, and a resync sends it again."""
    with without_worker(staging, two.config, SINK) as (tp, lease):
        refused_by_b(tp, two, lease)
        influx_query(two.direct["b"], "DROP MEASUREMENT clash")
        sql(staging_url, "UPDATE twophase_dead_letters SET target = ''")
        two.down("b")
        requeuer = Requeuer(tp.db, tp.stager)
        selection = requeuer.select(SINK, RequeueFilter())
        assert selection.target == ""
        requeuer.decide(lease, selection)
        tp.committer.recover(lease)  # in a; b down: owed it still
        assert sorted(deliveries(staging_url, SINK, "a")) == [-1, 0]
        two.up("b")
        assert tp.catch_up.run(lease, ["b"]).delivered == (("b", -1),)
    assert influx_count(two.direct["b"], "clash") == 3
    influx_query(two.direct["b"], "DROP MEASUREMENT clash")  # b loses it again
    report = ops.resync(
        full(staging, two.config), SINK, "b", from_epoch=0, guard=ops.Guard(force=True)
    )
    assert report.state == "live"
    assert influx_count(two.direct["b"], "clash") == 3
    assert sorted(deliveries(staging_url, SINK, "b")) == [-1, 0]


# -- the catch-up worker ----------------------------------------------------------------


def test_the_catch_up_worker_outlives_a_failure_of_its_own_bookkeeping(
    staging: StagingConfig, two: Targets, staging_url: str
) -> None:
    from devkit.faultproxy import wait_until

    with two_phase(staging, dataclasses.replace(two.config)) as tp:
        lease = tp.committer.claim(SINK, "r1", "q1")
        two.down("b")
        commit(tp, lease, 0)
        broken = {"left": 3}
        lagging = tp.targets.lagging

        def failing_lagging(*args: Any) -> None:
            if broken["left"]:
                broken["left"] -= 1
                raise RuntimeError("the store's bookkeeping failed")
            lagging(*args)

        tp.targets.lagging = failing_lagging  # the worker records b's failures through it
        tp.catch_up._poll_s = 0.1
        tp.catch_up.watch(lease)
        assert wait_until(lambda: broken["left"] == 0, 20)
        two.up("b")
        assert wait_until(lambda: deliveries(staging_url, SINK, "b") == [0], 30)
    expect(two.direct["b"], [0])


def test_a_promote_time_letter_of_one_target_names_it(
    staging: StagingConfig, influx: TargetConfig, staging_url: str
) -> None:
    """One target is the case N = 1: its letters name it (``default``), no sentinel."""
    write_points(influx, ['clash,host=z v="text" 1700000000000000001'])
    with two_phase(staging, influx) as tp:
        lease = tp.committer.claim(SINK, "r1", "q1")
        clash = [f"clash,host=h v=1.5 {1700000000000000000 + i}" for i in range(2)]
        messages = stage(tp, SINK, 0, [lines(0, 3) + clash], run=lease.run_id)
        tp.committer.commit(lease, 0, messages)
    assert sql(staging_url, "SELECT DISTINCT target FROM twophase_dead_letters") == [("default",)]
    assert target_rows(staging_url, SINK)["default"]["delivered"] == 0
    assert influx_count(influx, M) == 3


def test_corrections_reach_a_target_in_the_order_they_were_decided(
    staging: StagingConfig, two: Targets, staging_url: str
) -> None:
    """Correction -1 was decided before -2: a target lacking both gets -1 first, and a
    record of -2 before -1 is refused (newest first would let an older correction's
    value land last)."""
    with two_phase(staging, two.config) as tp:
        lease = tp.committer.claim(SINK, "r1", "q1")
        commit(tp, lease, 0)
        for correction in (-1, -2):  # two COMMITTED corrections owed to b, never sent
            sql(
                staging_url,
                "INSERT INTO twophase_epochs (sink_id, epoch, state, write_ids, checksum,"
                " points_staged, committed_at, target) VALUES (%s, %s, 'COMMITTED', '{}', '',"
                " 0, now(), 'b')",
                SINK,
                correction,
            )
        assert tp.targets.next_missing(SINK, "b") == (-1, False)
        with pytest.raises(TargetOrderError, match="lacks epoch -1"):
            tp.targets.delivered(lease, "b", -2, (0, 0))
        done = tp.catch_up.run(lease, ["b"])
    assert done.delivered == (("b", -1), ("b", -2))
