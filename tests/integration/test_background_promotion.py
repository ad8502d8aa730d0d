"""Background promotion against the real servers: an epoch promotes on a thread while
the caller stages the next; a failure is raised by the next commit, the epoch left
PRECOMMITTED; the same point key written twice in an epoch keeps its winner."""

from __future__ import annotations

import pytest

from devkit import InfluxServer
from tests.staging import M, epoch_row, lines, stage
from tests.support import (
    OWN_INFLUX_DB,
    begin_run,
    changed,
    influx_count,
    influx_rows,
    two_phase,
)
from twophase.config import BACKGROUND, InfluxDBSettings, StagingConfig, TargetConfig
from twophase.errors import TargetUnavailableError
from twophase.model import EpochState


def background(influx: TargetConfig, **more: object) -> TargetConfig:
    return changed(influx, promotion=BACKGROUND, **more)


def test_commit_returns_once_decided_and_the_next_commit_waits(
    staging: StagingConfig, influx: TargetConfig
) -> None:
    with two_phase(staging, background(influx, batch_points=50)) as tp:
        lease = begin_run(tp, "s", "r1", "q1")
        first = tp.committer.commit(lease, 0, stage(tp, "s", 0, [lines(0, 500)]))
        assert (first.state, first.promoted) == (EpochState.PRECOMMITTED, None)
        second = tp.committer.commit(lease, 1, stage(tp, "s", 1, [lines(1, 500)]))
        # commit(1) waited for epoch 0 before deciding 1 (I3): 0 is COMMITTED now
        assert epoch_row(staging.url.reveal(), "s", 0)["state"] == "COMMITTED"
        assert second.state == EpochState.PRECOMMITTED and second.recovered == ()
        assert [r.epoch for r in tp.committer.drain()] == [1]
        assert tp.ledger.pending("s") == []
    assert influx_count(influx, M) == 1000


def test_a_failed_background_promotion_is_raised_by_the_next_commit(
    staging: StagingConfig, own_influx: InfluxServer
) -> None:
    influx = TargetConfig(
        url=own_influx.url,
        retry_initial_s=0.1,
        retry_max_s=0.5,
        retry_deadline_s=2,
        influxdb=InfluxDBSettings(api="v1", database=OWN_INFLUX_DB),
    )
    with two_phase(staging, background(influx)) as tp:
        lease = begin_run(tp, "s", "r1", "q1")
        own_influx.stop()  # InfluxDB fails while epoch 0 promotes in the background
        assert tp.committer.commit(lease, 0, stage(tp, "s", 0, [lines(0, 50)])).state == (
            EpochState.PRECOMMITTED
        )
        messages = stage(tp, "s", 1, [lines(1, 50)])
        with pytest.raises(TargetUnavailableError, match="still unavailable"):
            tp.committer.commit(lease, 1, messages)
        assert tp.ledger.pending("s") == [0]  # 0 left PRECOMMITTED, 1 not decided
    own_influx.start()
    # The restart (a new process: new parts, a new run) delivers 0, then 1.
    with two_phase(staging, background(influx)) as tp:
        lease = begin_run(tp, "s", "r2", "q1")
        outcome = tp.committer.commit(lease, 1, stage(tp, "s", 1, [lines(1, 50)]))
        assert outcome.recovered == (0,)
        tp.committer.drain()
        assert tp.ledger.pending("s") == []
    assert influx_count(influx, M) == 100


@pytest.mark.parametrize("resends", [1, 3])
def test_the_same_point_key_twice_in_an_epoch_keeps_its_winner(
    staging: StagingConfig, influx: TargetConfig, resends: int
) -> None:
    """Two tasks write the same point key with different values: the epoch's fixed order
    decides the winner, whichever thread promotes and however often it is sent (I4)."""
    key = f"{M},host=a v=%s 1600000000000000000"
    with two_phase(staging, background(influx)) as tp:
        lease = begin_run(tp, "s", "r1", "q1")
        tp.committer.commit(lease, 0, stage(tp, "s", 0, [[key % "1.5"], [key % "2.5"]]))
        tp.committer.drain()
        winner = influx_rows(influx, M)
        for _ in range(resends):  # an operator's resend: the fixed set, in its fixed order
            next(iter(tp.deliveries.values())).send(tp.reader.plan("s", 0))
            assert influx_rows(influx, M) == winner
    assert [row[2] for row in winner] == [(("v", 2.5),)]  # the later write in the order


def test_drain_waits_for_a_promotion_in_flight(
    staging: StagingConfig, influx: TargetConfig
) -> None:
    with two_phase(staging, background(influx, batch_points=10)) as tp:
        lease = begin_run(tp, "s", "r1", "q1")
        tp.committer.commit(lease, 0, stage(tp, "s", 0, [lines(0, 2000)]))
        (result,) = tp.committer.drain()  # 200 requests of 10 points: still in flight
        assert (result.epoch, result.delivered) == (0, 2000)
        # drained, not closed: everything is in InfluxDB and the epoch is COMMITTED
        assert influx_count(influx, M) == 2000
        assert epoch_row(staging.url.reveal(), "s", 0)["state"] == "COMMITTED"
