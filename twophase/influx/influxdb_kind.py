"""InfluxDB as a kind of target: the 1.x, 2.x and 3 write APIs (and VictoriaMetrics,
which takes them), told by an ``http://`` or ``https://`` URL.

A re-sent body changes nothing: InfluxDB overwrites a point with the same measurement,
tag set and timestamp (VictoriaMetrics when it runs with ``-dedup.minScrapeInterval``;
see [`InfluxWriter`][twophase.influx.writers.InfluxWriter]). Verify reads a target back
with InfluxQL through ``/query`` (1.x API only).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from twophase.config import TargetConfig
from twophase.influx.api import make_writer, resolve_api
from twophase.influx.query import window_query
from twophase.targets.contract import OVERWRITE, TargetKind

__all__ = ["KIND", "InfluxReadback"]


class InfluxReadback:
    """Windows of a measurement read through InfluxQL (``/query``), streamed."""

    def __init__(self, config: TargetConfig) -> None:
        self._writer = make_writer(resolve_api(config))
        self._policy = config.influxdb.retention_policy

    def window(self, measurement: str, start: int, end: int) -> Iterable[dict[str, Any]]:
        return self._writer.read(window_query(measurement, start, end, self._policy))

    def probe(self) -> None:
        """PermanentError at once for an API verify cannot read, or the server's error."""
        list(self._writer.read("SHOW MEASUREMENTS LIMIT 1"))

    def close(self) -> None:
        self._writer.close()


def _check(config: TargetConfig) -> None:
    if config.influxdb.api != "auto":
        config.influxdb.validate_for_api()


KIND = TargetKind(
    name="influxdb",
    schemes=("http", "https"),
    resend=OVERWRITE,
    writer=make_writer,
    readback=InfluxReadback,
    check=_check,
)
