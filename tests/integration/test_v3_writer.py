"""The ``v3`` writer (InfluxDB 3's ``/api/v3/write_lp``) against a server that answers
as InfluxDB 3's documentation says (:mod:`tests.integration.influx3`): requests are
all or nothing, a refusal names its line, a busy server says when to come back.
Through the whole protocol: an epoch with refused points is delivered, the refused
points become dead letters with the server's reason, and no bisection is needed."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from tests.integration.influx3 import Influx3, serve
from tests.staging import stage
from tests.support import two_phase
from twophase.config import InfluxDBSettings, Secret, StagingConfig, TargetConfig
from twophase.errors import ConfigError, TargetAuthError
from twophase.influx.api import make_writer
from twophase.model import EpochState
from twophase.store.views import Views
from twophase.targets.sender import BatchSender

TOKEN = f"v3-{uuid.uuid4().hex}"
SINK = "v3-sink"
BASE = 1_700_000_000_000_000_000


@pytest.fixture
def influx3() -> Iterator[tuple[Influx3, TargetConfig]]:
    state = Influx3(TOKEN)
    server, url = serve(state)
    config = TargetConfig(
        url=url,
        retry_initial_s=0.05,
        retry_max_s=1,
        retry_deadline_s=20,
        influxdb=InfluxDBSettings(api="v3", database="dash", token=Secret(TOKEN)),
    )
    yield state, config
    server.shutdown()
    server.server_close()


def lines(count: int, bad: tuple[int, ...] = ()) -> list[str]:
    return [
        f'v3m,host=h,n={i} v="text" {BASE + i}'
        if i in bad
        else f"v3m,host=h,n={i} v={i}.5 {BASE + i}"
        for i in range(count)
    ]


def test_an_epoch_with_refused_points_is_delivered_without_bisection(
    influx3: tuple[Influx3, TargetConfig], staging: StagingConfig, staging_url: str
) -> None:
    state, config = influx3
    with two_phase(staging, config) as tp:
        lease = tp.committer.claim(SINK, "r1", "q1")
        outcome = tp.committer.commit(lease, 0, stage(tp, SINK, 0, [lines(40, bad=(7, 30))]))
        assert outcome.state == EpochState.COMMITTED
        assert outcome.promoted is not None
        assert (outcome.promoted.delivered, outcome.promoted.rejected) == (38, 2)
        letters = list(Views(tp.db).dead_letters(SINK, None))
    assert sorted(state.points) == sorted(
        (f"v3m,host=h,n={i}", str(BASE + i)) for i in range(40) if i not in (7, 30)
    )
    # The whole body, refused naming line 8; the rest, refused naming line 30 of it (the
    # original line 31); the rest again, taken. Bisection would have taken 12 requests.
    assert [r["lines"] for r in state.requests] == [40, 39, 38]
    # The epoch's chunks go out as stored, gzip; the lines taken apart go out as text.
    assert [r["encoding"] for r in state.requests] == ["gzip", None, None]
    first = state.requests[0]["query"]
    assert first == {
        "db": ["dash"],
        "precision": ["nanosecond"],
        "accept_partial": ["false"],
        "no_sync": ["false"],
    }
    reason = "the target rejected the point: invalid column type for column 'v', expected Float"
    assert [(d.phase, d.reason) for d in letters] == [("promote", reason)] * 2
    assert sorted(d.payload for d in letters) == sorted(lines(40, bad=(7, 30))[i] for i in (7, 30))


def test_a_busy_server_is_retried_after_the_time_it_asks(
    influx3: tuple[Influx3, TargetConfig],
) -> None:
    state, config = influx3
    state.unavailable, state.retry_after = 2, "1"
    writer = make_writer(config)
    body = "\n".join(lines(5)).encode()
    began = time.monotonic()
    rejected = BatchSender(writer, config).send(body, 5, lambda: lines(5))
    waited = time.monotonic() - began
    writer.close()
    assert rejected == [] and len(state.points) == 5
    assert len(state.requests) == 3 and waited >= 2.0  # two 503s, each "come back in 1 s"


def test_a_wrong_token_is_an_auth_error_that_names_the_setting_not_the_token(
    influx3: tuple[Influx3, TargetConfig],
) -> None:
    state, config = influx3
    state.token = "another"
    writer = make_writer(config)
    with pytest.raises(TargetAuthError) as refused:
        writer.write(b"v3m,host=h v=1 1")
    writer.close()
    message = str(refused.value)
    assert "TWOPHASE_INFLUX_TOKEN" in message and "database" in message
    assert TOKEN not in message and "InfluxDB 3 database 'dash'" in message


def test_the_v3_api_needs_a_database() -> None:
    with pytest.raises(ConfigError) as missing:
        make_writer(TargetConfig(url="http://127.0.0.1:1", influxdb=InfluxDBSettings(api="v3")))
    assert missing.value.option == "TWOPHASE_INFLUX_DB"
    assert "InfluxDB 3 API" in str(missing.value)
