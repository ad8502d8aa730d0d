"""The InfluxDB kind passes the conformance kit against VictoriaMetrics (the dev env's,
started with ``-dedup.minScrapeInterval``: a re-sent sample is kept once).

VictoriaMetrics answers no InfluxQL, so the kit reads it back through its export API
(``/api/v1/export``: a field ``f`` of measurement ``m`` is the metric ``m_f``, its
timestamps in milliseconds). It refuses no point (it skips what it cannot store) and
runs without authentication: those two checks are skipped.

A point written again at the same time with another value keeps one of the values,
not necessarily the one written last (the configuration guide says so; the version
here keeps either): ``keeps_last_write`` is False, so the catch-up check shows each
epoch delivered and the rewritten point held once, not their order. It is written
through the 1.x API, whose database becomes the ``db`` label: the check's second
target is another database, read back apart from the first.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterable
from typing import Any

import pytest
import urllib3

from twophase.config import InfluxDBSettings, Secret, TargetConfig
from twophase.targets import Readback
from twophase.testing import TargetConformance

_MS = 1_000_000


class VmReadback:
    """Windows of a measurement read through ``/api/v1/export``, as series."""

    def __init__(self, url: str, db: str) -> None:
        self._url, self._db = url, db
        self._pool = urllib3.PoolManager(retries=False, timeout=10)

    def window(self, measurement: str, start: int, end: int) -> Iterable[dict[str, Any]]:
        self._pool.request("GET", f"{self._url}/internal/force_flush")
        query = urllib.parse.urlencode(
            {
                "match[]": f'{{__name__=~"{measurement}_.+",db="{self._db}"}}',
                "start": f"{start / 1e9:.3f}",
                "end": f"{end / 1e9:.3f}",
            }
        )
        body = self._pool.request("GET", f"{self._url}/api/v1/export?{query}").data.decode()
        return [_series(measurement, json.loads(line)) for line in body.splitlines() if line]

    def probe(self) -> None:
        self._pool.request("GET", f"{self._url}/health")

    def close(self) -> None:
        self._pool.clear()


def _series(measurement: str, exported: dict[str, Any]) -> dict[str, Any]:
    """One exported metric as a series of one field (``db``, the label the write API
    adds, left out)."""
    labels = dict(exported["metric"])
    field = labels.pop("__name__")[len(measurement) + 1 :]
    labels.pop("db", None)
    rows = [
        [ms * _MS, value]
        for ms, value in zip(exported["timestamps"], exported["values"], strict=True)
    ]
    return {"name": measurement, "tags": labels, "columns": ["time", field], "values": rows}


class TestVictoriaMetricsConformance(TargetConformance):
    keeps_last_write = False

    @pytest.fixture
    def target(self, vm_url: str) -> TargetConfig:
        return TargetConfig(
            url=vm_url,
            retry_deadline_s=20,
            retry_initial_s=0.05,
            retry_max_s=1,
            influxdb=InfluxDBSettings(api="v1", database="conformance"),
        )

    @pytest.fixture
    def second_target(self, target: TargetConfig) -> TargetConfig:
        return target.with_fields(database="conformance-b")

    def readback(self, config: TargetConfig) -> Readback:
        return VmReadback(config.url, str(config.influxdb.database))

    def bad_credentials(self, config: TargetConfig) -> TargetConfig | None:
        return None  # no authentication: any token is taken

    def refused_line(self, measurement: str, time_ns: int) -> str | None:
        return None


class TestVictoriaMetricsV2Conformance(TestVictoriaMetricsConformance):
    """The same checks through the InfluxDB 2.x writer (``/api/v2/write``), which adds no
    ``db`` label: the catch-up check's two targets share the store, so the older
    epoch's value of the rewritten point may come after the newer one's, which
    ``keeps_last_write`` False allows."""

    @pytest.fixture
    def target(self, vm_url: str) -> TargetConfig:
        return TargetConfig(
            url=vm_url,
            retry_deadline_s=20,
            retry_initial_s=0.05,
            retry_max_s=1,
            influxdb=InfluxDBSettings(
                api="v2", bucket="conformance", org="o", token=Secret("unused")
            ),
        )

    @pytest.fixture
    def second_target(self, target: TargetConfig) -> TargetConfig:
        return target

    def readback(self, config: TargetConfig) -> Readback:
        return VmReadback(config.url, "")  # points without a db label
