"""The InfluxDB kind's ``v3`` writer passes the conformance kit against the stand-in for
InfluxDB 3's write API (:mod:`tests.integration.influx3`; no InfluxDB 3 server can be
installed on the test machines).

The stand-in answers no query: the kit reads back what it holds in this process (its
crash checks' child writes to it over HTTP as well). It refuses a field ``v`` sent as a
string, as the kit's refused point is, and a wrong token (401).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

from tests.integration.influx3 import Influx3, serve
from twophase.config import InfluxDBSettings, Secret, TargetConfig
from twophase.points.lineproto import parse_line
from twophase.targets import Readback
from twophase.testing import TargetConformance

SERVERS: dict[str, Influx3] = {}  # base URL -> the stand-in serving it


@pytest.fixture
def influx3_server() -> Iterator[Any]:
    """Start a stand-in; yields a function giving a config of a new one each call."""
    started = []

    def start() -> TargetConfig:
        token = f"v3-{uuid.uuid4().hex}"
        state = Influx3(token)
        server, url = serve(state)
        started.append((server, url))
        SERVERS[url] = state
        return TargetConfig(
            url=url,
            retry_deadline_s=20,
            retry_initial_s=0.05,
            retry_max_s=1,
            influxdb=InfluxDBSettings(api="v3", database="conformance", token=Secret(token)),
        )

    yield start
    for server, url in started:
        server.shutdown()
        server.server_close()
        SERVERS.pop(url, None)


class Influx3Readback:
    """The stand-in's points of a measurement, each series with its own fields."""

    def __init__(self, state: Influx3) -> None:
        self._state = state

    def window(self, measurement: str, start: int, end: int) -> Iterable[dict[str, Any]]:
        with self._state.lock:
            held = [
                f"{series} {fields} {time}" for (series, time), fields in self._state.points.items()
            ]
        points = [parse_line(line) for line in held]
        return [
            {
                "name": p.measurement,
                "tags": dict(p.tags),
                "columns": ["time", *p.fields],
                "values": [[p.time_ns, *p.fields.values()]],
            }
            for p in points
            if p.measurement == measurement and p.time_ns is not None and start <= p.time_ns <= end
        ]

    def probe(self) -> None:
        """Always readable: the state is in this process."""

    def close(self) -> None:
        """Nothing held."""


class TestInflux3Conformance(TargetConformance):
    @pytest.fixture
    def target(self, influx3_server: Any) -> TargetConfig:
        return influx3_server()

    @pytest.fixture
    def second_target(self, influx3_server: Any) -> TargetConfig:
        return influx3_server()

    def readback(self, config: TargetConfig) -> Readback:
        return Influx3Readback(SERVERS[config.url])
