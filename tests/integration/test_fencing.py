"""Fencing during promotion against the real servers (I5, I7): a zombie run whose
requests cannot reach InfluxDB and a new run that takes the sink over.

The new run recovers the zombie's epoch N and commits N+1 with a newer value of the
same point key (update output mode). The zombie is still retrying N: a retry that
came after the new run's claim would land N's old value over N+1's. Each request and
each retry is preceded by a read of the lease, so the zombie sends nothing more and
InfluxDB keeps the newer value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from devkit.faultproxy import CUT, PASS, FaultProxy, wait_until
from tests.staging import M, epoch_row, lines, stage
from tests.support import begin_run, influx_count, influx_query, two_phase
from twophase.config import BACKGROUND, INLINE, StagingConfig, TargetConfig
from twophase.errors import FencedError
from twophase.influx.api import make_writer
from twophase.model import EpochState

KEY = f"{M},host=key v=%s 1600000000000000000"  # one point key, written by epochs 0 and 1
OLD, NEW = 1.5, 2.5


def key_value(influx: TargetConfig) -> Any:
    """The value InfluxDB holds for the point key (None when it holds none)."""
    series = influx_query(influx, f"SELECT v FROM \"{M}\" WHERE host = 'key'")  # noqa: S608
    values = [row[1] for item in series for row in item.get("values") or []]
    assert len(values) <= 1
    return values[0] if values else None


@pytest.fixture
def proxy(influx: TargetConfig) -> Iterator[FaultProxy]:
    with FaultProxy.for_url(influx.url) as running:
        yield running


def zombie_config(influx: TargetConfig, proxy: FaultProxy, promotion: str) -> TargetConfig:
    """The zombie's InfluxDB: through the proxy, retrying for long, 20 points a request."""
    return dataclasses.replace(
        influx,
        url=proxy.url,
        promotion=promotion,
        batch_points=20,
        retry_initial_s=0.05,
        retry_max_s=0.2,
        retry_deadline_s=60,
    )


@pytest.mark.parametrize("lanes", [1, 4])
@pytest.mark.parametrize("promotion", [INLINE, BACKGROUND])
def test_a_zombie_retries_nothing_once_a_newer_run_committed_a_newer_value(
    staging: StagingConfig, influx: TargetConfig, proxy: FaultProxy, promotion: str, lanes: int
) -> None:
    staging = dataclasses.replace(staging, lanes=lanes)
    epoch0 = [KEY % OLD, *lines(0, 100, host="a"), *lines(0, 100, host="b")]
    with (
        two_phase(staging, zombie_config(influx, proxy, promotion)) as zombie,
        two_phase(staging, influx) as newer,
        ThreadPoolExecutor(1) as pool,
    ):
        proxy.set_mode(CUT)  # the zombie's requests never reach InfluxDB: it must retry
        lease = begin_run(zombie, "s", "rA", "q1")
        messages = stage(zombie, "s", 0, [epoch0], run="rA")

        def promote_zombie() -> None:  # inline: in commit; background: on its thread
            zombie.committer.commit(lease, 0, messages)
            zombie.committer.drain()

        promoting = pool.submit(promote_zombie)
        assert wait_until(lambda: proxy.connections >= 2, 20)  # tried, cut, retrying

        # The new run takes the sink over: it finds epoch 0 PRECOMMITTED, promotes it,
        # then commits epoch 1 with the newer value of the same point key.
        taken = begin_run(newer, "s", "rB", "q1")
        outcome = newer.committer.commit(taken, 1, stage(newer, "s", 1, [[KEY % NEW]], run="rB"))
        assert (outcome.recovered, outcome.state) == ((0,), EpochState.COMMITTED)
        assert key_value(influx) == NEW

        proxy.set_mode(PASS)  # the zombie's next retry would now reach InfluxDB
        with pytest.raises(FencedError, match="fenced by a newer run"):
            promoting.result(timeout=30)

    assert key_value(influx) == NEW  # not the zombie's stale value over the newer run's
    assert proxy.write_requests == 0  # nothing of the zombie's reached InfluxDB
    assert influx_count(influx, M) == len(epoch0)
    assert epoch_row(staging.url.reveal(), "s", 1)["state"] == EpochState.COMMITTED


class FencesAfter:
    """Wraps the real writer: once ``n`` requests were acknowledged, ``fence()`` runs
    (a newer run claims the sink) before the call returns."""

    def __init__(self, inner: Any, n: int, fence: Callable[[], object]) -> None:
        self.inner, self.n, self.fence = inner, n, fence
        self.sent = 0

    def write(self, body: bytes, gzipped: bool = False) -> None:
        self.inner.write(body, gzipped)
        self.sent += 1
        if self.sent == self.n:
            self.fence()

    def close(self) -> None:
        self.inner.close()


@pytest.mark.lanes(1)  # one request at a time: the count after the fencing is exact
def test_a_fenced_inline_promotion_stops_before_its_next_request(
    staging: StagingConfig, influx: TargetConfig
) -> None:
    small = dataclasses.replace(influx, batch_points=10)
    with two_phase(staging, small) as newer:
        writer = FencesAfter(make_writer(small), 3, lambda: begin_run(newer, "s", "r2", "q1"))
        with two_phase(staging, small, writer=writer) as zombie:
            lease = begin_run(zombie, "s", "r1", "q1")
            with pytest.raises(FencedError, match="fenced by a newer run"):
                zombie.committer.commit(lease, 0, stage(zombie, "s", 0, [lines(0, 100)]))
        assert writer.sent == 3  # the fourth request was never started
        assert influx_count(influx, M) == 30
        assert epoch_row(staging.url.reveal(), "s", 0)["state"] == EpochState.PRECOMMITTED
        taken = begin_run(newer, "s", "r2", "q1")  # the new run's own claim: a no-op
        assert [r.epoch for r in newer.committer.recover(taken)] == [0]
    assert influx_count(influx, M) == 100
