"""One sink, two InfluxDB targets: each epoch exactly once in each, in epoch order; a
target that is down is left lagging and catches up from staging while the other goes on."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from devkit.faultproxy import CUT, PASS, wait_until
from tests.integration.fanout_helpers import (
    N,
    Pair,
    dead_letter_targets,
    deliveries,
    expect,
    points,
    target_rows,
    two_targets,
    write_points,
)
from tests.staging import M, scalar, stage
from tests.support import influx_count, influx_query, two_phase
from twophase.config import NamedTarget, StagingConfig
from twophase.errors import TargetUnavailableError
from twophase.model import EpochState, Lease
from twophase.operations.requeuer import RequeueFilter, Requeuer
from twophase.protocol.commit.runtime import TwoPhase
from twophase.protocol.maintain.gc import GarbageCollector

SINK = "fan"


def commit(tp: TwoPhase, lease: Lease, epoch: int) -> Any:
    messages = stage(tp, SINK, epoch, [points(epoch)], run=lease.run_id)
    return tp.committer.commit(lease, epoch, messages)


@pytest.fixture
def pair(influx_url: str, request: pytest.FixtureRequest) -> Any:
    marker = request.node.get_closest_marker("targets")
    with two_targets(influx_url, **(marker.kwargs if marker else {})) as pair:
        yield pair


@pytest.fixture
def fan(staging: StagingConfig, pair: Pair) -> Iterator[TwoPhase]:
    with two_phase(staging, pair.config) as tp:
        yield tp


def test_each_epoch_reaches_both_targets_once(fan: TwoPhase, pair: Pair, staging_url: str) -> None:
    lease = fan.committer.claim(SINK, "r1", "q1")
    for epoch in range(3):
        assert commit(fan, lease, epoch).state == EpochState.COMMITTED
    expect(pair.a, [0, 1, 2])
    expect(pair.b_direct, [0, 1, 2])
    rows = target_rows(staging_url, SINK)
    assert rows == {
        "a": {"state": "live", "delivered": 2, "from": 0},
        "b": {"state": "live", "delivered": 2, "from": 0},
    }
    assert deliveries(staging_url, SINK, "b") == [0, 1, 2]


def test_a_target_down_is_left_lagging_and_catches_up_in_epoch_order(
    fan: TwoPhase, pair: Pair, staging_url: str
) -> None:
    lease = fan.committer.claim(SINK, "r1", "q1")
    pair.proxy.set_mode(CUT)
    for epoch in range(3):  # b is down: each commit returns with the epoch in a
        assert commit(fan, lease, epoch).state == EpochState.COMMITTED
        expect(pair.a, list(range(epoch + 1)))
    assert influx_count(pair.b_direct, M) == 0
    rows = target_rows(staging_url, SINK)
    assert (rows["a"]["state"], rows["b"]["state"], rows["b"]["delivered"]) == (
        "live",
        "lagging",
        None,
    )
    pair.proxy.set_mode(PASS)  # back: the catch-up worker delivers 0, 1, 2 in order
    assert wait_until(lambda: target_rows(staging_url, SINK)["b"]["state"] == "live", 60)
    expect(pair.b_direct, [0, 1, 2])
    assert deliveries(staging_url, SINK, "b") == [0, 1, 2]
    assert commit(fan, lease, 3).state == EpochState.COMMITTED  # live again: with the commit
    expect(pair.b_direct, [0, 1, 2, 3])


@pytest.mark.targets(min_targets=2, retry_deadline_s=3)
def test_fewer_than_min_targets_fail_the_commit_and_recovery_completes_it(
    fan: TwoPhase, pair: Pair, staging_url: str
) -> None:
    lease = fan.committer.claim(SINK, "r1", "q1")
    pair.proxy.set_mode(CUT)
    with pytest.raises(TargetUnavailableError):
        commit(fan, lease, 0)
    assert scalar(staging_url, "SELECT state FROM twophase_epochs") == EpochState.PRECOMMITTED
    expect(pair.a, [0])  # a took it (and it is recorded): recovery sends it to b only
    assert target_rows(staging_url, SINK)["b"]["state"] == "live"  # not lagging: it failed
    pair.proxy.set_mode(PASS)
    pair.proxy.reset_counts()
    assert [r.epoch for r in fan.committer.recover(lease)] == [0]
    expect(pair.b_direct, [0])
    assert pair.proxy.write_requests == 1
    assert deliveries(staging_url, SINK, "a") == [0]


@pytest.mark.targets(retry_deadline_s=3)
def test_no_target_up_fails_the_commit(fan: TwoPhase, pair: Pair, staging_url: str) -> None:
    lease = fan.committer.claim(SINK, "r1", "q1")
    pair.proxy.set_mode(CUT)
    assert commit(fan, lease, 0).state == EpochState.COMMITTED  # b left lagging
    dead = dataclasses.replace(pair.a, url=pair.proxy.url)
    targets = (pair.config.targets[0].__class__("a", dead), pair.config.targets[1])
    with two_phase(fan.config.staging, dataclasses.replace(pair.config, targets=targets)) as tp:
        lease = tp.committer.claim(SINK, "r2", "q1")
        with pytest.raises(TargetUnavailableError):
            commit(tp, lease, 1)
    assert scalar(staging_url, "SELECT state FROM twophase_epochs WHERE epoch = 1") == (
        EpochState.PRECOMMITTED
    )


def test_a_target_added_to_a_sink_starts_at_the_next_epoch(
    staging: StagingConfig, pair: Pair, staging_url: str
) -> None:
    """One server (``target_url``: target ``default``), then targets ``default`` (the same
    server, carried over) and b: default goes on, b starts at the next epoch."""
    with two_phase(staging, pair.a) as one:
        lease = one.committer.claim(SINK, "r1", "q1")
        for epoch in range(2):
            commit(one, lease, epoch)
    assert target_rows(staging_url, SINK) == {
        "default": {"state": "live", "delivered": 1, "from": 0}
    }
    carried = (NamedTarget("default", pair.a), pair.config.targets[1])
    with two_phase(staging, dataclasses.replace(pair.config, targets=carried)) as fan:
        lease = fan.committer.claim(SINK, "r2", "q1")
        commit(fan, lease, 2)
    expect(pair.a, [0, 1, 2])
    assert influx_count(pair.b_direct, M) == N + 1  # epoch 2 only
    rows = target_rows(staging_url, SINK)
    assert rows["default"] == {"state": "live", "delivered": 2, "from": 0}
    assert rows["b"] == {"state": "live", "delivered": 2, "from": 2}


@pytest.mark.targets(target_max_lag_s=3600)
def test_a_lagging_target_holds_retention_until_quarantined(
    fan: TwoPhase, pair: Pair, staging_url: str
) -> None:
    lease = fan.committer.claim(SINK, "r1", "q1")
    fan.catch_up.close()  # no catch-up: b stays behind
    pair.proxy.set_mode(CUT)
    for epoch in range(2):
        commit(fan, lease, epoch)
    week = 8 * 86400
    held = fan.gc.collect(SINK, ahead_s=week)  # past retention, but b lacks them
    assert (held.epochs_purged, held.quarantined) == (0, ())
    strict = GarbageCollector(fan.db, 7 * 86400, 3600, max_lag_s=0.0)
    report = strict.collect(SINK, ahead_s=week)
    assert report.quarantined == ((SINK, "b"),)
    assert report.epochs_purged == 2
    assert target_rows(staging_url, SINK)["b"]["state"] == "quarantined"
    events = scalar(
        staging_url,
        "SELECT count(*) FROM twophase_epoch_events WHERE event = 'target_quarantined'",
    )
    assert events == 1


def test_after_a_reset_both_targets_start_again_at_the_new_querys_first_epoch(
    fan: TwoPhase, pair: Pair, staging_url: str
) -> None:
    lease = fan.committer.claim(SINK, "r1", "q1")
    for epoch in range(2):
        commit(fan, lease, epoch)
    fan.ledger.reset(SINK)
    assert target_rows(staging_url, SINK) == {}
    for influx in (pair.a, pair.b_direct):
        influx_query(influx, "DROP MEASUREMENT proto")
    lease = fan.committer.claim(SINK, "r2", "q2")  # a new query, from epoch 0 again
    assert commit(fan, lease, 0).state == EpochState.COMMITTED
    expect(pair.a, [0])
    expect(pair.b_direct, [0])
    assert target_rows(staging_url, SINK)["b"] == {"state": "live", "delivered": 0, "from": 0}


def test_a_point_one_target_refuses_is_its_dead_letter_and_requeued_to_it_only(
    fan: TwoPhase, pair: Pair, staging_url: str
) -> None:
    # b's shard holds field v of "clash" as a string: b refuses the float points, a takes them
    write_points(pair.b_direct, ['clash,host=z v="text" 1700000000000000001'])
    clash = [f"clash,host=h{i} v={i}.5 {1700000000000000000 + i}" for i in range(3)]
    lease = fan.committer.claim(SINK, "r1", "q1")
    messages = stage(fan, SINK, 0, [points(0) + clash], run=lease.run_id)
    assert fan.committer.commit(lease, 0, messages).state == EpochState.COMMITTED
    letters = dead_letter_targets(staging_url)
    assert letters == {"b": 3}  # b's alone: a holds them
    assert influx_count(pair.a, "clash") == 3
    influx_query(pair.b_direct, "DROP MEASUREMENT clash")  # the cause fixed in b
    requeuer = Requeuer(fan.db, fan.stager)
    selection = requeuer.select(SINK, RequeueFilter(target="b"))
    assert (selection.target, len(selection.ids)) == ("b", 3)
    requeuer.decide(lease, selection)
    fan.committer.recover(lease)
    assert influx_count(pair.b_direct, "clash") == 3
    assert deliveries(staging_url, SINK, "a") == [0]  # the correction went to b only
    assert deliveries(staging_url, SINK, "b") == [0, -1]
    assert scalar(staging_url, "SELECT target FROM twophase_epochs WHERE epoch = -1") == "b"
