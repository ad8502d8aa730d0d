"""Bounded backlogs on real servers: a target whose backlog passes
target_max_backlog_bytes is quarantined as one lagging past target_max_lag is; a
lagging target is caught up at target_catch_up_rate, measured; a commit's own epoch
is never paced.

Targets are databases of the test InfluxDB, each behind a fault proxy of its own
(`proxied_targets`), so that a test takes one down to make it lag."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.cli_helpers import sql
from tests.integration.fanout_helpers import Targets, proxied_targets, target_rows, without_worker
from tests.staging import M, lines, stage
from tests.support import changed, influx_count, two_phase
from twophase.config import NamedTarget, StagingConfig, TargetConfig
from twophase.model import EpochState, Lease
from twophase.protocol.commit.runtime import TwoPhase
from twophase.protocol.maintain.gc import GarbageCollector

SINK = "backlog"
WEEK = 7 * 86400
RATE = 5000  # points per second of a paced catch-up
POINTS = 3000  # per epoch: four epochs paced at RATE take 2.4 s


@pytest.fixture
def three(influx_url: str) -> Iterator[Targets]:
    with proxied_targets(influx_url, ("a", "b", "c")) as targets:
        yield targets


def commit(tp: TwoPhase, lease: Lease, epoch: int, n: int = 20) -> Any:
    messages = stage(tp, SINK, epoch, [lines(epoch, n)], run=lease.run_id)
    return tp.committer.commit(lease, epoch, messages)


def staged_bytes(url: str, epochs: list[int]) -> int:
    [(size,)] = sql(
        url,
        "SELECT sum(staged_bytes) FROM twophase_epochs WHERE sink_id = %s AND epoch = ANY(%s)",
        SINK,
        epochs,
    )
    return int(size)


def quarantine_events(url: str) -> list[str]:
    rows = sql(
        url,
        "SELECT detail FROM twophase_epoch_events WHERE sink_id = %s"
        " AND event = 'target_quarantined' ORDER BY at",
        SINK,
    )
    return [detail for (detail,) in rows]


def paced(config: TargetConfig, name: str, **fields: Any) -> TargetConfig:
    """The sink's configuration with target ``name``'s own settings changed."""
    targets = tuple(
        NamedTarget(t.name, changed(t.config, **fields)) if t.name == name else t
        for t in config.targets
    )
    return dataclasses.replace(config, targets=targets)


def test_a_target_whose_backlog_passes_the_bound_is_quarantined_one_under_it_is_not(
    staging: StagingConfig, three: Targets, staging_url: str
) -> None:
    with without_worker(staging, three.config, SINK) as (tp, lease):
        three.down("b")
        for epoch in range(3):
            assert commit(tp, lease, epoch).state == EpochState.COMMITTED
        three.down("c")
        assert commit(tp, lease, 3).state == EpochState.COMMITTED
        b_bytes, c_bytes = staged_bytes(staging_url, [0, 1, 2, 3]), staged_bytes(staging_url, [3])
        assert b_bytes > c_bytes > 0
        lags = {s.target: s.lag_bytes for s in tp.targets.states(SINK)}
        assert (lags["b"], lags["c"]) == (b_bytes, c_bytes)  # what the exporter shows

        bound = (b_bytes + c_bytes) // 2
        loose = GarbageCollector(tp.db, WEEK, 3600, max_lag_s=3600, max_backlog_bytes=b_bytes)
        assert loose.collect(SINK).quarantined == ()  # at the bound is not past it
        gc = GarbageCollector(tp.db, WEEK, 3600, max_lag_s=3600, max_backlog_bytes=bound)
        report = gc.collect(SINK)
        assert report.quarantined == ((SINK, "b"),)
        reason = f"backlog of {b_bytes} bytes, more than {bound} (target_max_backlog_bytes)"
        assert report.quarantine_reasons == (reason,)
        assert quarantine_events(staging_url) == [f"b: {reason}"]
        states = {t: row["state"] for t, row in target_rows(staging_url, SINK).items()}
        assert states == {"a": "live", "b": "quarantined", "c": "lagging"}
        assert gc.collect(SINK).quarantined == ()  # once: no second event
        assert len(quarantine_events(staging_url)) == 1

        # A resync starts with the backlog that had the target quarantined: a collection
        # during it does not quarantine it again for those epochs.
        three.up("b")
        assert tp.targets.restart(lease, SINK, "b", None) == 0
        assert gc.collect(SINK).quarantined == ()
        assert target_rows(staging_url, SINK)["b"]["state"] == "lagging"


def test_no_byte_bound_quarantines_nothing_by_size(
    staging: StagingConfig, two: Targets, staging_url: str
) -> None:
    with without_worker(staging, two.config, SINK) as (tp, lease):
        two.down("b")
        for epoch in range(2):
            commit(tp, lease, epoch)
        unbounded = GarbageCollector(tp.db, WEEK, 3600, max_lag_s=3600, max_backlog_bytes=0)
        assert unbounded.collect(SINK).quarantined == ()
        lagging = GarbageCollector(tp.db, WEEK, 3600, max_lag_s=0.0, max_backlog_bytes=10**12)
        report = lagging.collect(SINK)
        assert report.quarantine_reasons == ("lagging more than 0 s (target_max_lag)",)
    assert quarantine_events(staging_url) == ["b: lagging more than 0 s (target_max_lag)"]


def test_a_lagging_target_is_caught_up_at_the_rate(
    staging: StagingConfig, two: Targets, staging_url: str
) -> None:
    config = paced(two.config, "b", target_catch_up_rate=RATE, batch_points=500)
    epochs = list(range(4))
    with without_worker(staging, config, SINK) as (tp, lease):
        two.down("b")
        for epoch in epochs:
            commit(tp, lease, epoch, POINTS)
        two.up("b")
        began = time.monotonic()
        report = tp.catch_up.run(lease, ["b"])
        elapsed = time.monotonic() - began
    assert report.delivered == tuple(("b", e) for e in epochs) and report.failed == ()
    assert influx_count(two.direct["b"], M) == POINTS * len(epochs)
    rate = POINTS * len(epochs) / elapsed
    assert RATE * 0.9 <= rate <= RATE * 1.1, (rate, elapsed)
    assert target_rows(staging_url, SINK)["b"]["state"] == "live"


def test_an_unpaced_catch_up_is_not_held_to_the_rate(staging: StagingConfig, two: Targets) -> None:
    """The measure above can fail: the same backlog without a rate goes much faster."""
    config = paced(two.config, "b", batch_points=500)
    with without_worker(staging, config, SINK) as (tp, lease):
        two.down("b")
        for epoch in range(4):
            commit(tp, lease, epoch, POINTS)
        two.up("b")
        began = time.monotonic()
        tp.catch_up.run(lease, ["b"])
        elapsed = time.monotonic() - began
    assert POINTS * 4 / elapsed > RATE * 1.5, elapsed


def test_a_commits_own_epoch_to_a_caught_up_target_is_not_paced(
    staging: StagingConfig, two: Targets
) -> None:
    slow = 500  # points per second: a paced epoch of POINTS would take 6 s
    config = paced(two.config, "b", target_catch_up_rate=slow)
    config = dataclasses.replace(config, min_targets=2)  # each commit waits for b
    with two_phase(staging, config) as tp:
        lease = tp.committer.claim(SINK, "r1", "q1")
        began = time.monotonic()
        for epoch in range(2):
            assert commit(tp, lease, epoch, POINTS).state == EpochState.COMMITTED
        elapsed = time.monotonic() - began
    assert influx_count(two.direct["b"], M) == 2 * POINTS
    assert elapsed < 2 * POINTS / slow / 3, elapsed
