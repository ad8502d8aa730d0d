"""Fuzzing through the real InfluxDB 1.x: rows the point builder accepts are written
and read back unchanged (measurement, tags, field values and types, time)."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings

from tests.fuzz import examples, plain_number, points
from tests.support import Influx
from twophase.config import TargetConfig
from twophase.errors import ConfigError, PointError
from twophase.points.builder import PointBuilder, PointSpec

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")
_numbers = itertools.count()


def line_of(measurement: str, point: tuple[dict[str, Any], dict[str, Any], int]) -> str | None:
    tags, fields, stamp = point
    spec = PointSpec(measurement, tuple(tags), tuple(fields), "__time")
    try:
        # InfluxDB reads raw line breaks inside string fields: allowed, as for InfluxDB
        # targets (allow_newlines_in_strings), so that they are fuzzed through it too.
        return PointBuilder(spec, allow_newlines=True).line({**tags, **fields, "__time": stamp})
    except ConfigError:  # a key no point may have: refused with the sink's definition
        event("spec refused")
    except PointError:
        event("rejected")
    return None


def same(stored: Any, written: Any) -> bool:
    expected = plain_number(written)
    if isinstance(expected, bool):
        return stored is expected
    if isinstance(expected, float):  # JSON gives 1.0 back as 1
        return isinstance(stored, int | float) and math.isclose(stored, expected, rel_tol=0)
    return bool(stored == expected) and type(stored) is type(expected)


@pytest.fixture
def scratch(influx: TargetConfig) -> Influx:
    """The test's fresh InfluxDB database, through the plain 1.x HTTP API."""
    return Influx(influx.url, str(influx.influxdb.database))


@settings(
    max_examples=examples(300),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(points())
def test_accepted_points_read_back_unchanged(scratch: Influx, point: Any) -> None:
    measurement = f"fuzz{next(_numbers)}"  # a fresh measurement: no type clash between examples
    line = line_of(measurement, point)
    if line is None:
        return
    event("accepted")
    status, message = scratch.write(line)
    assert status == 204, (line, message)
    # One measurement per query: across measurements InfluxDB casts a field key's
    # integers to floats where another measurement holds floats under that key.
    stored = scratch.points(f'"{measurement}"').get(measurement)
    tags, fields, stamp = point
    assert stored is not None and len(stored) == 1, (line, stored)
    (time_ns, stored_tags, stored_fields) = stored[0]
    assert time_ns == stamp
    assert stored_tags == {k: v for k, v in tags.items() if v != ""}, line
    assert set(stored_fields) == set(fields), line
    for key, value in fields.items():
        assert same(stored_fields[key], value), (key, stored_fields[key], value, line)
