"""Outages of the real servers: InfluxDB down mid-promote, PostgreSQL restarted between epochs."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devkit import InfluxServer, PostgresServer
from devkit.ports import free_port
from tests.staging import M, lines, stage
from tests.support import (
    OWN_INFLUX_DB,
    alembic,
    begin_run,
    influx_count,
    staging_config_for,
    two_phase,
    unique,
)
from twophase.config import InfluxDBSettings, StagingConfig, TargetConfig
from twophase.errors import TargetUnavailableError
from twophase.influx.api import make_writer
from twophase.model import EpochState


class StopsInfluxAfter:
    """Wraps the real writer: after ``n`` acknowledged batches it stops the real
    InfluxDB server and starts it again ``down_s`` seconds later, in a thread."""

    def __init__(self, inner: Any, server: InfluxServer, n: int, down_s: float):
        self.inner, self.server, self.n, self.down_s = inner, server, n, down_s
        self.sent = 0
        self.restarter: threading.Thread | None = None

    def write(self, body: bytes, gzipped: bool = False) -> None:
        self.inner.write(body, gzipped)
        self.sent += 1
        if self.sent == self.n:
            self.server.stop()
            self.restarter = threading.Thread(target=self._restart)
            self.restarter.start()

    def _restart(self) -> None:
        time.sleep(self.down_s)
        self.server.start()

    def close(self) -> None:
        self.inner.close()


def outage_config(server: InfluxServer, **retry: Any) -> TargetConfig:
    return TargetConfig(
        url=server.url,
        retry_initial_s=0.1,
        **retry,
        influxdb=InfluxDBSettings(api="v1", database=OWN_INFLUX_DB),
    )


def test_influx_down_during_promote_then_back(
    staging: StagingConfig, own_influx: InfluxServer
) -> None:
    influx = outage_config(own_influx, batch_points=100, retry_deadline_s=60, retry_max_s=2)
    flaky = StopsInfluxAfter(make_writer(influx), own_influx, n=3, down_s=4)
    with two_phase(staging, influx, writer=flaky) as tp:  # the real writer, real outage
        lease = begin_run(tp, "s", "r1", "q1")
        outcome = tp.committer.commit(lease, 0, stage(tp, "s", 0, [lines(0, 1000)]))
        assert flaky.restarter is not None
        flaky.restarter.join()
        assert outcome.state == EpochState.COMMITTED
        assert influx_count(influx, M) == 1000


def test_influx_down_past_deadline_leaves_epoch_precommitted(
    staging: StagingConfig, own_influx: InfluxServer
) -> None:
    influx = outage_config(own_influx, retry_deadline_s=2, retry_max_s=0.5)
    with two_phase(staging, influx) as tp:
        lease = begin_run(tp, "s", "r1", "q1")
        messages = stage(tp, "s", 0, [lines(0, 50)])
        own_influx.stop()
        with pytest.raises(TargetUnavailableError, match="still unavailable"):
            tp.committer.commit(lease, 0, messages)
        assert tp.ledger.pending("s") == [0]
        own_influx.start()
        assert [r.epoch for r in tp.committer.recover(lease)] == [0]
        assert influx_count(influx, M) == 50


@pytest.fixture
def own_postgres(tmp_path: Path) -> Iterator[PostgresServer]:
    server = PostgresServer(tmp_path / "pg", free_port())
    server.start()
    yield server
    server.destroy()  # the cluster may live in /tmp (root): leave nothing behind


def test_postgres_restarted_between_epochs(
    own_postgres: PostgresServer, influx: TargetConfig
) -> None:
    name = unique("restart")
    own_postgres.create_database(name)
    url = own_postgres.url_for(name)
    assert alembic("upgrade", "head", url=url).returncode == 0
    with two_phase(staging_config_for(url), influx) as tp:
        lease = begin_run(tp, "s", "r1", "q1")
        assert (
            tp.committer.commit(lease, 0, stage(tp, "s", 0, [lines(0, 10)])).state
            == EpochState.COMMITTED
        )
        own_postgres.restart()
        outcome = tp.committer.commit(lease, 1, stage(tp, "s", 1, [lines(1, 10)]))
        assert outcome.state == EpochState.COMMITTED
        assert tp.ledger.pending("s") == []
    assert influx_count(influx, M) == 20
