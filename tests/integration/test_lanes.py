"""Lanes (``promote_connections``) against the real servers: each series staged in one
lane and promoted over its own connection, all lanes at once; the same point key
written twice in an epoch keeps its winner with 1 and with 4 lanes, however often it
is promoted; dead letters per lane; a fenced background promoter stops sending."""

from __future__ import annotations

import dataclasses
import gzip
import time
from collections import defaultdict
from collections.abc import Iterator

import psycopg
import pytest

from devkit.faultproxy import FaultProxy, wait_until
from tests.staging import epoch_row, stage
from tests.support import admin_conninfo, begin_run, influx_count, influx_rows, two_phase
from twophase.config import BACKGROUND, StagingConfig, TargetConfig
from twophase.errors import FencedError
from twophase.protocol.stage.lanes import LaneChooser

M = "lanes"
BASE = 1_700_000_000_000_000_000


def series_lines(epoch: int, task: int, series: int, per: int, value: float) -> list[str]:
    """``per`` points of each of ``series`` series; keys depend on epoch, not on task."""
    return [
        f"{M},host=h{s},zone=z{s % 3} v={value},task={task}i {BASE + epoch * 10_000 + i}"
        for s in range(series)
        for i in range(per)
    ]


@pytest.fixture
def proxy(influx: TargetConfig) -> Iterator[FaultProxy]:
    with FaultProxy.for_url(influx.url) as running:
        yield running


def lanes_of(staging: StagingConfig, sink: str) -> dict[str, set[int]]:
    """Each staged series (line text up to the first space) -> the lanes it was staged in."""
    seen: dict[str, set[int]] = defaultdict(set)
    with psycopg.connect(admin_conninfo(staging.url.reveal())) as conn:
        rows = conn.execute(
            "SELECT c.lane, c.body, c.body_gz FROM twophase_staged_chunks c"
            " JOIN twophase_writes w USING (write_id) WHERE w.sink_id = %s",
            (sink,),
        )
        for lane, body, gz in rows:
            text = body if gz is None else gzip.decompress(gz).decode()[:-1]
            for line in text.split("\n"):
                seen[line.split(" ")[0]].add(lane)
    return seen


def test_each_series_keeps_to_one_lane_and_the_lanes_send_at_once(
    staging: StagingConfig, influx: TargetConfig, proxy: FaultProxy
) -> None:
    four = dataclasses.replace(staging, lanes=4)
    slow = dataclasses.replace(influx, url=proxy.url, batch_points=25)
    proxy.delay_s = 0.02  # every request a 20 ms round trip: the lanes overlap
    with two_phase(four, slow) as tp:
        lease = begin_run(tp, "s", "r1", "q1")
        parts = [series_lines(0, task, 40, 5, task + 0.5) for task in range(3)]
        outcome = tp.committer.commit(lease, 0, stage(tp, "s", 0, parts))
        assert outcome.promoted is not None and outcome.promoted.delivered == 600
    staged = lanes_of(four, "s")
    assert len(staged) == 40 and all(len(lanes) == 1 for lanes in staged.values())
    assert set().union(*staged.values()) == {0, 1, 2, 3}
    chooser = LaneChooser(4)
    assert all(lanes == {chooser.lane(series + " v=1")} for series, lanes in staged.items())
    assert proxy.peak_connections == 4  # one connection per lane, all open at once
    assert influx_count(influx, M) == 200  # 3 tasks wrote the same 200 keys


@pytest.mark.parametrize("lanes", [1, 4])
def test_the_same_point_key_from_two_tasks_keeps_its_winner(
    staging: StagingConfig, influx: TargetConfig, lanes: int
) -> None:
    """Task 1 writes every key of task 0 again with another value: the later write in the
    epoch's order wins, after the first promotion and after every re-promotion, over 1
    or 4 lanes, and when promoted again with the other number of lanes."""
    staged_with = dataclasses.replace(staging, lanes=lanes)
    small = dataclasses.replace(influx, batch_points=10)  # many requests per lane
    with two_phase(staged_with, small) as tp:
        lease = begin_run(tp, "s", "r1", "q1")
        parts = [series_lines(0, 0, 30, 4, 1.5), series_lines(0, 1, 30, 4, 2.5)]
        tp.committer.commit(lease, 0, stage(tp, "s", 0, parts))
        winner = influx_rows(influx, M)
        for _ in range(3):  # re-promotions: the fixed set, in its fixed order
            next(iter(tp.deliveries.values())).send(tp.reader.plan("s", 0))
            assert influx_rows(influx, M) == winner
    other = dataclasses.replace(staging, lanes=5 - lanes)
    with two_phase(other, small) as tp:
        next(iter(tp.deliveries.values())).send(tp.reader.plan("s", 0))
    assert influx_rows(influx, M) == winner
    assert len(winner) == 120
    assert {dict(row[2])["v"] for row in winner} == {2.5}  # task 1, later in the order
    assert {dict(row[2])["task"] for row in winner} == {1}


def test_dead_letters_and_bisection_per_lane(staging: StagingConfig, influx: TargetConfig) -> None:
    four = dataclasses.replace(staging, lanes=4)
    small = dataclasses.replace(influx, batch_points=8)
    good = series_lines(1, 0, 20, 3, 1.5)
    # a string where the measurement's field is a float: refused by InfluxDB, one in
    # several series, so in several lanes, each inside a request of good points
    bad = [f'{M},host=h{s},zone=z{s % 3} v="text" {BASE + 99_000 + s}' for s in range(0, 20, 3)]
    with two_phase(four, small) as tp:
        lease = begin_run(tp, "s", "r1", "q1")
        tp.committer.commit(lease, 0, stage(tp, "s", 0, [series_lines(0, 0, 20, 1, 0.5)]))
        outcome = tp.committer.commit(lease, 1, stage(tp, "s", 1, [good + bad]))
        assert outcome.promoted is not None
        assert (outcome.promoted.delivered, outcome.promoted.rejected) == (60, len(bad))
        next(iter(tp.deliveries.values())).send(tp.reader.plan("s", 1))  # again: no letter twice
    with psycopg.connect(admin_conninfo(staging.url.reveal())) as conn:
        letters = conn.execute(
            "SELECT payload, reason FROM twophase_dead_letters WHERE epoch = 1 ORDER BY seq"
        ).fetchall()
    assert sorted(p for p, _ in letters) == sorted(bad)
    assert all("field type conflict" in reason for _, reason in letters)
    assert len({LaneChooser(4).lane(line) for line in bad}) > 1
    assert influx_count(influx, M) == 80
    assert epoch_row(staging.url.reveal(), "s", 1)["state"] == "COMMITTED"


@pytest.mark.parametrize("lanes", [1, 4])
def test_a_fenced_background_promoter_sends_nothing_more(
    staging: StagingConfig, influx: TargetConfig, proxy: FaultProxy, lanes: int
) -> None:
    """A newer run takes the sink while epoch 0 promotes in the background: the old
    run's promoter stops before its next request (at most one request per lane was
    under way), its drain raises FencedError, and the new run delivers the epoch."""
    staged_with = dataclasses.replace(staging, lanes=lanes)
    slow = dataclasses.replace(influx, url=proxy.url, batch_points=10, promotion=BACKGROUND)
    proxy.delay_s = 0.02
    with two_phase(staged_with, slow) as tp:
        lease = begin_run(tp, "s", "r1", "q1")
        tp.committer.commit(lease, 0, stage(tp, "s", 0, [series_lines(0, 0, 50, 20, 1.5)]))
        assert wait_until(lambda: proxy.write_requests >= 3, 10)
        with two_phase(staged_with, influx) as other:
            begin_run(other, "s", "r2", "q1")  # fences r1
        at_fence = proxy.write_requests
        with pytest.raises(FencedError, match="fenced by a newer run"):
            tp.committer.drain()
        time.sleep(0.3)  # anything still coming would arrive by now
        assert at_fence <= proxy.write_requests <= at_fence + lanes
        assert proxy.write_requests < 100  # 1,000 points in requests of 10: stopped early
    assert epoch_row(staging.url.reveal(), "s", 0)["state"] == "PRECOMMITTED"
    with two_phase(staged_with, influx) as tp:
        assert [r.epoch for r in tp.committer.recover(begin_run(tp, "s", "r3", "q1"))] == [0]
    assert influx_count(influx, M) == 1000
