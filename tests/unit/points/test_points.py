"""Rows to line protocol: validation, time handling, escaping, laziness.

Pure and fast: no servers. What InfluxDB itself does with the lines is checked
by tests/integration/test_points_roundtrip.py.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from collections.abc import Iterator, Mapping
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import numpy as np
import pandas as pd
import pytest
from influxdb_client import Point, WritePrecision

from twophase.errors import ConfigError, PointError, TwoPhaseError
from twophase.points.builder import (
    MAX_PAYLOAD_BYTES,
    MAX_SERIES_KEY_BYTES,
    MAX_TIME_NS,
    MIN_TIME_NS,
    PointBuilder,
    PointSpec,
    Rejected,
    row_payload,
)

T0 = 1_700_000_000_000_000_000  # a fixed clock reading, in ns


def builder(measurement: str = "m", tags: tuple[str, ...] = (), **spec: Any) -> PointBuilder:
    clock = spec.pop("clock", lambda: T0)
    return PointBuilder(PointSpec(measurement, tags, **spec), clock_ns=clock)


def line(row: Mapping[str, Any], **spec: Any) -> str:
    return builder(**spec).line(row)


def reason(row: Mapping[str, Any], **spec: Any) -> str:
    with pytest.raises(PointError) as caught:
        builder(**spec).line(row)
    return caught.value.reason


def config_error(**spec: Any) -> ConfigError:
    measurement = spec.pop("measurement", "m")
    with pytest.raises(ConfigError) as caught:
        PointSpec(measurement, **spec).validate()
    return caught.value


# --- PointSpec.validate --------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "option", "words"),
    [
        ({"measurement": ""}, "measurement", "non-empty"),
        ({"measurement": 5}, "measurement", "non-empty"),
        ({"measurement": "a\nb"}, "measurement", "newline"),
        ({"measurement": "a\rb"}, "measurement", "carriage return"),
        ({"measurement": "a\tb"}, "measurement", "tab"),
        ({"measurement": "a\x00b"}, "measurement", "NUL"),
        ({"measurement": "a\ud800"}, "measurement", "surrogate"),
        ({"measurement": "#cpu"}, "measurement", "comment"),
        ({"measurement": "cpu\\"}, "measurement", "backslash"),
        ({"measurement": "a\\ b"}, "measurement", "backslash"),
        ({"measurement": "a\\,b"}, "measurement", "backslash"),
        ({"measurement": "a\\=b"}, "measurement", "backslash"),
        ({"measurement": 'a\\"b'}, "measurement", "backslash"),
        ({"measurement": "x" * (MAX_SERIES_KEY_BYTES - 4)}, "measurement", "limit"),
        ({"measurement": " " * (MAX_SERIES_KEY_BYTES // 2)}, "measurement", "limit"),
        ({"tag_columns": "host"}, "tags", "list"),
        ({"tag_columns": ("",)}, "tags", "column name"),
        ({"tag_columns": ("a", "a")}, "tags", "more than once"),
        ({"tag_columns": ("time",)}, "tags", "'time'"),
        ({"tag_columns": ("a\nb",)}, "tags", "newline"),
        ({"tag_columns": ("host\\",)}, "tags", "backslash"),
        ({"tag_columns": ("a\\ b",)}, "tags", "odd run of them before a space"),
        ({"tag_columns": ("a\\\\\\ b",)}, "tags", "odd run of them before a space"),
        ({"tag_columns": ("ts",), "time_column": "ts"}, "tags", "time column"),
        ({"field_columns": ()}, "fields", "empty"),
        ({"field_columns": "value"}, "fields", "list"),
        ({"field_columns": ("time",)}, "fields", "time_column='time'"),
        ({"field_columns": ("a\rb",)}, "fields", "carriage return"),
        ({"field_columns": ('a\\"b',)}, "fields", "backslash"),
        ({"field_columns": ("a\\ b",)}, "fields", "backslash"),
        ({"field_columns": ("v\\",)}, "fields", "backslash"),
        ({"field_columns": ("v", "v")}, "fields", "more than once"),
        ({"field_columns": ("host",), "tag_columns": ("host",)}, "fields", "tag columns"),
        ({"field_columns": ("ts",), "time_column": "ts"}, "fields", "time column"),
        ({"time_column": ""}, "time", "non-empty"),
        ({"precision": "m"}, "precision", "s, ms, us, ns"),
        ({"null_fields": "drop"}, "null_fields", "reject, omit"),
    ],
)
def test_validate_names_the_option(spec: dict[str, Any], option: str, words: str) -> None:
    error = config_error(**spec)
    assert error.option == option
    assert words in str(error)


@pytest.mark.parametrize(
    "measurement",
    ["cpu load", "a,b", "a=b", 'a"b', "a'b", "a\\b", "a\\\\b", "a\\n", "ünï ☃ 𝄞", " x ", "=", "x#"],
)
def test_validate_accepts_awkward_but_faithful_measurements(measurement: str) -> None:
    tags = ("a b", "c,d", "e=f", 'g"h', "i\\j", "k\\\\ l", "m\\,n", "o\\=p", 'q\\"r')
    PointSpec(measurement, tags, ("k l", "m\\\\ n", "o\\p")).validate()


def test_spec_stores_lists_as_tuples_and_is_hashable() -> None:
    spec = PointSpec("m", ["b", "a"], ["v"])  # type: ignore[arg-type]
    assert spec.tag_columns == ("b", "a") and spec.field_columns == ("v",)
    assert hash(spec) == hash(PointSpec("m", ("b", "a"), ("v",)))


def test_builder_validates_its_spec() -> None:
    with pytest.raises(ConfigError):
        PointBuilder(PointSpec("m", precision="minutes"))


# --- line format ------------------------------------------------------------------


def test_line_has_sorted_escaped_tags_and_fields_and_ns_time() -> None:
    row = {
        "stream": "s 1",
        "isp": "a,b=c",
        "rate": 2.5,
        "bytes": 3,
        "ok": True,
        "label": 'say "hi" \\o/',
        "ts": 1_000,
    }
    got = line(row, tags=("stream", "isp"), time_column="ts")
    assert got == (
        'm,isp=a\\,b\\=c,stream=s\\ 1 bytes=3i,label="say \\"hi\\" \\\\o/",ok=true,rate=2.5 1000'
    )


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (True, "true"),
        (False, "false"),
        (0, "0i"),
        (-5, "-5i"),
        (2**63 - 1, "9223372036854775807i"),
        (-(2**63), "-9223372036854775808i"),
        (1.0, "1"),
        (0.1, "0.1"),
        (-2.5, "-2.5"),
        (1e16, "1e+16"),
        (5e-324, "5e-324"),
        ("", '""'),
        ("tab\there", '"tab\there"'),
        ("\x0b\x0c\x1b\x7f\x85\u2028", '"\x0b\x0c\x1b\x7f\x85\u2028"'),  # no line ends
        ("☃", '"☃"'),
        (Decimal("2.50"), "2.5"),
        (Decimal("-3"), "-3"),
        (np.int64(7), "7i"),
        (np.float32(0.5), "0.5"),
        (np.float32(0.1), "0.1"),  # its own shortest text, as Point writes it
        (np.float16(3.0), "3"),
        (np.float32(-0.0), "-0"),
        (np.float64(1.25), "1.25"),
        (np.bool_(True), "true"),
        (np.str_("x"), '"x"'),
    ],
)
def test_field_value_formats(value: Any, text: str) -> None:
    assert line({"v": value}) == f"m v={text} {T0}"


# --- raw line breaks in string field values ---------------------------------------------

INJECTION = "x\nadmin,host=prod cpu=99 1700000000000000000\n"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("a\nb", "contains a newline"),
        ("a\rb", "contains a carriage return"),
        ("crlf\r\n", "contains a newline"),
        ("\n", "contains a newline"),
        (INJECTION, "contains a newline"),
        (np.str_("a\nb"), "contains a newline"),
    ],
)
def test_a_raw_line_break_in_a_string_field_dead_letters_the_row(value: Any, words: str) -> None:
    row = {"s": value, "v": 1}
    (item,) = builder().convert([row])
    assert isinstance(item, Rejected)
    assert item.reason.startswith("field 's' value ") and words in item.reason
    assert "VictoriaMetrics" in item.reason and "allow_newlines_in_strings=true" in item.reason
    assert json.loads(item.payload) == {"s": str(value), "v": 1}  # the row, kept whole


def test_the_injected_point_never_reaches_a_line_by_default() -> None:
    rows = [{"host": "a", "s": "fine", "v": 1}, {"host": "b", "s": INJECTION, "v": 2}]
    items = list(PointBuilder(PointSpec("m", ("host",)), clock_ns=lambda: T0).convert(rows))
    assert items[0] == f'm,host=a s="fine",v=1i {T0}'
    assert isinstance(items[1], Rejected) and items[1].index == 1
    assert not any("admin" in item for item in items if isinstance(item, str))


@pytest.mark.parametrize("value", ["a\nb", "a\rb", "crlf\r\n", INJECTION])
def test_allow_newlines_keeps_the_raw_line_break_as_point_writes_it(value: str) -> None:
    build = PointBuilder(PointSpec("m"), clock_ns=lambda: T0, allow_newlines=True)
    got = build.line({"s": value})
    assert got == f'm s="{value}" {T0}'
    assert got == Point("m").field("s", value).time(T0, WritePrecision.NS).to_line_protocol()


def test_allow_newlines_changes_nothing_outside_string_fields() -> None:
    build = PointBuilder(PointSpec("m", ("t",)), clock_ns=lambda: T0, allow_newlines=True)
    for row, words in [({"t": "a\nb", "v": 1}, "tag 't'"), ({"t": "x", "a\nb": 1}, "field key")]:
        with pytest.raises(PointError, match=words):
            build.line(row)
    with pytest.raises(PointError, match="NUL"):
        build.line({"t": "x", "s": "a\n\x00"})


@pytest.mark.parametrize(
    ("value", "text"),
    [(np.uint8(7), "7u"), (np.uint64(2**64 - 1), "18446744073709551615u"), (np.int64(7), "7i")],
)
def test_unsigned_integers_take_the_u_suffix_for_the_2x_api(value: Any, text: str) -> None:
    builder = PointBuilder(PointSpec("m", time_column="t"), unsigned=True)
    assert builder.line({"v": value, "t": T0}) == f"m v={text} {T0}"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (float("nan"), "'v' is NaN"),
        (float("inf"), "'v' is +infinity"),
        (float("-inf"), "'v' is -infinity"),
        (np.float64("nan"), "'v' is NaN"),
        (2**63, "does not fit a 64-bit integer"),
        (-(2**63) - 1, "does not fit a 64-bit integer"),
        (np.uint64(7), "unsigned integer (uint64), which the InfluxDB 1.x write API"),
        (np.uint8(0), "cast the column to a signed integer type, or write through the 2.x"),
        (np.float32("inf"), "'v' is +infinity"),
        (Decimal("NaN"), "Decimal NaN"),
        (Decimal("sNaN"), "Decimal sNaN"),
        (Decimal("Infinity"), "Decimal Infinity"),
        (Decimal("1e400"), "too large for a float"),
        (b"raw", "unsupported type bytes"),
        ([1, 2], "unsupported type list"),
        ({"a": 1}, "unsupported type dict"),
        (datetime(2024, 1, 1), "unsupported type datetime"),
        (np.timedelta64(5, "s"), "unsupported type timedelta64"),
        (complex(1, 2), "unsupported type complex"),
        ("x" * 65_536, "65536-byte string"),
        ("é" * 32_768, "65536-byte string"),
        ("a\x00b", "NUL"),
        ("a\udc80b", "surrogate"),
    ],
)
def test_bad_field_values_are_rejected_naming_the_field(value: Any, words: str) -> None:
    got = reason({"v": value})
    assert "field 'v'" in got
    assert words in got


def test_longest_string_field_is_accepted() -> None:
    assert line({"v": "x" * 65_535}).startswith('m v="xxx')
    assert line({"v": "é" * 32_767 + "x"}).startswith('m v="éé')  # 65535 bytes


@pytest.mark.parametrize("null", [None, pd.NA, pd.NaT, np.datetime64("NaT")])
def test_null_field_rejects_by_default_and_is_left_out_with_omit(null: Any) -> None:
    row = {"a": null, "b": 1}
    assert "field 'a' is null" in reason(row)
    assert "null_fields='omit'" in reason(row)
    assert line(row, null_fields="omit") == f"m b=1i {T0}"


def test_row_without_field_values_is_rejected() -> None:
    assert "no field values" in reason({"a": None}, null_fields="omit")
    assert "no field values" in reason({"host": "h"}, tags=("host",))
    assert "no field values" in reason({"t": 1}, time_column="t")


def test_missing_columns_are_rejected_not_treated_as_null() -> None:
    assert "no field column 'b'" in reason({"a": 1}, field_columns=("a", "b"), null_fields="omit")
    assert "no tag column 'host'" in reason({"a": 1}, tags=("host",))
    assert "no time column 'ts'" in reason({"a": 1}, time_column="ts")


def test_explicit_field_columns_ignore_other_columns() -> None:
    row = {"a": 1, "b": [1], "c": None}
    assert line(row, field_columns=("a",)) == f"m a=1i {T0}"


# --- tags -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("plain", "plain"),
        (42, "42"),
        (1.5, "1.5"),
        (True, "True"),
        (Decimal("1.10"), "1.10"),
        ("a b,c=d", "a\\ b\\,c\\=d"),
        ('q"x', 'q"x'),
        ("a\\b", "a\\b"),
        ("\\x", "\\x"),
        ("ü ☃ 𝄞", "ü\\ ☃\\ 𝄞"),
        ("#", "#"),
        ("a\\\\ b", "a\\\\\\ b"),
        ("a\\,b\\=", "a\\\\,b\\\\="),
    ],
)
def test_tag_values_are_strings_escaped(value: Any, text: str) -> None:
    assert line({"t": value, "v": 1}, tags=("t",)) == f"m,t={text} v=1i {T0}"


@pytest.mark.parametrize("null", [None, pd.NA, pd.NaT])
def test_null_tag_is_left_out(null: Any) -> None:
    assert line({"t": null, "u": "x", "v": 1}, tags=("t", "u")) == f"m,u=x v=1i {T0}"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("", "empty string"),
        ("a\nb", "newline"),
        ("a\rb", "carriage return"),
        ("a\tb", "tab"),
        ("a\x00b", "NUL"),
        ("a\ud800b", "surrogate"),
        ("C:\\dir\\", "ends with a backslash"),
        ("a\\ b", "odd run of them before a space"),
        ("a\\\\\\ b", "odd run of them before a space"),
        (float("nan"), "NaN"),
        (np.float32("nan"), "NaN"),
    ],
)
def test_bad_tag_values_are_rejected_naming_the_tag(value: Any, words: str) -> None:
    got = reason({"t": value, "v": 1}, tags=("t",))
    assert "tag 't'" in got
    assert words in got


def test_tag_cache_does_not_hide_rejections() -> None:
    build = builder(tags=("a", "b"))
    assert build.line({"a": "x", "b": "x", "v": 1}) == f"m,a=x,b=x v=1i {T0}"
    for _ in range(2):  # a bad value stays bad on every row, whatever its column
        with pytest.raises(PointError, match="tag 'b'"):
            build.line({"a": "x", "b": "", "v": 1})


# --- discovered field keys (field_columns=None) ---------------------------------------


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ("time", "set time_column='time'"),
        ("", "is empty"),
        ("a\nb", "newline"),
        ("a\tb", "tab"),
        ('a\\"b', "backslash"),
        ("a\\ b", "backslash"),
        ("a\\\\\\,b", "backslash"),
        ("end\\", "backslash"),
    ],
)
def test_unwritable_discovered_field_keys_reject_the_row(key: str, words: str) -> None:
    got = reason({key: 1})
    assert "field key" in got and words in got and "rename the column" in got


@pytest.mark.parametrize("key", ["a\\\\ b", "a\\\\,b", "a\\\\=b", "a\\b", "a\\n", "#k", "=", ","])
def test_faithful_discovered_field_keys_pass(key: str) -> None:
    assert builder().line({key: 1}).endswith(f"=1i {T0}")


def test_non_string_discovered_key_rejects_the_row() -> None:
    assert "field key 5 is not a string" in reason({5: 1, "v": 2})  # type: ignore[dict-item]


def test_unwritable_key_with_null_value_is_harmless_when_omitted() -> None:
    assert line({"time": None, "v": 1}, null_fields="omit") == f"m v=1i {T0}"


def test_discovered_fields_exclude_tags_and_time() -> None:
    row = {"host": "h", "ts": 5, "b": 2, "a": 1}
    assert line(row, tags=("host",), time_column="ts") == "m,host=h a=1i,b=2i 5"


def test_rows_with_different_columns_get_their_own_fields() -> None:
    build = builder()
    assert build.line({"a": 1}) == f"m a=1i {T0}"
    assert build.line({"b": 2, "a": 1}) == f"m a=1i,b=2i {T0 + 1}"


# --- time -------------------------------------------------------------------------------

UTC_2024 = 1_704_067_200_000_000_000  # 2024-01-01T00:00:00Z


@pytest.mark.parametrize(
    ("value", "precision", "expected"),
    [
        (UTC_2024, "ns", UTC_2024),
        (1_704_067_200, "s", UTC_2024),
        (1_704_067_200_000, "ms", UTC_2024),
        (1_704_067_200_000_000, "us", UTC_2024),
        (-1, "s", -1_000_000_000),
        (1.5, "s", 1_500_000_000),
        (1_704_067_200.123, "s", UTC_2024 + 123_000_000),
        (0.1, "ms", 100_000),
        (Decimal("1704067200.000000001"), "s", UTC_2024 + 1),
        (np.int64(1_704_067_200), "s", UTC_2024),
        (np.float64(2.5), "ms", 2_500_000),
        (datetime(2024, 1, 1), "s", UTC_2024),  # naive is UTC
        (datetime(2024, 1, 1, 1, tzinfo=timezone(timedelta(hours=1))), "s", UTC_2024),
        (datetime(2024, 1, 1, 0, 0, 0, 1), "ns", UTC_2024 + 1_000),
        (datetime(1900, 1, 1), "ns", -2_208_988_800_000_000_000),
        (date(2024, 1, 1), "ns", UTC_2024),
        (pd.Timestamp("2024-01-01T00:00:00.000000001"), "ns", UTC_2024 + 1),
        (pd.Timestamp("2024-01-01T01:00:00.000000001+01:00"), "ns", UTC_2024 + 1),
        (pd.Timestamp(np.datetime64("2024-01-01", "s")), "ns", UTC_2024),
        (np.datetime64("2024-01-01T00:00:00.000000001"), "ns", UTC_2024 + 1),
        (np.datetime64("2024-01-01T00:00:00.000001"), "ns", UTC_2024 + 1_000),
        (np.datetime64("2024-01-01T00:00"), "ns", UTC_2024),
        (np.datetime64("2024-01"), "ns", UTC_2024),
        (np.datetime64("2024"), "ns", UTC_2024),
        ("2024-01-01", "ns", UTC_2024),
        ("2024-01-01T00:00:00Z", "ns", UTC_2024),
        ("2024-01-01T00:00:00z", "ns", UTC_2024),
        ("2024-01-01T00:00:00", "ns", UTC_2024),  # no offset is UTC
        ("2024-01-01 00:00", "ns", UTC_2024),
        ("2024-01-01T00:00:00.000000001Z", "ns", UTC_2024 + 1),
        ("2024-01-01T00:00:00.5Z", "ns", UTC_2024 + 500_000_000),
        ("2024-01-01T00:00:00,5Z", "ns", UTC_2024 + 500_000_000),
        ("2024-01-01T02:30:00+02:30", "ns", UTC_2024),
        ("2023-12-31T22:00:00-0200", "ns", UTC_2024),
        ("2024-01-01T05:00:00+05", "ns", UTC_2024),
    ],
)
def test_time_values(value: Any, precision: str, expected: int) -> None:
    got = line({"ts": value, "v": 1}, time_column="ts", precision=precision)
    assert got == f"m v=1i {expected}"


@pytest.mark.parametrize("null", [None, pd.NaT, pd.NA, np.datetime64("NaT")])
def test_null_time_is_rejected(null: Any) -> None:
    assert reason({"ts": null, "v": 1}, time_column="ts") == "time column 'ts' is null"


@pytest.mark.parametrize(
    "value",
    [
        "yesterday",
        "",
        "1704067200",
        "2024-13-01",
        "2024-02-30T00:00:00Z",
        "2024-01-01T24:00:00Z",
        "2024-01-01T23:59:60Z",
        "2024-01-01T00:00:00.1234567891Z",
        "2024-01-01T00:00:00+24:00",
        "2024-01-01T00:00:00+01:60",
        " 2024-01-01",
        True,
        np.bool_(False),
        float("nan"),
        float("inf"),
        Decimal("NaN"),
        b"2024",
        [1],
        np.timedelta64(5, "s"),
        timedelta(seconds=1),
    ],
)
def test_unparseable_time_is_rejected_showing_the_value(value: Any) -> None:
    got = reason({"ts": value, "v": 1}, time_column="ts")
    assert got.startswith(f"time column 'ts' cannot be parsed as a time: {repr(value)[:40]}")


@pytest.mark.parametrize(
    ("value", "precision"),
    [
        (MAX_TIME_NS + 1, "ns"),
        (MIN_TIME_NS - 1, "ns"),
        (2**63, "ns"),
        (9_300_000_000, "s"),
        (-9_300_000_000, "s"),
        (1e300, "s"),
        (datetime(2263, 1, 1), "ns"),
        (datetime(1677, 1, 1), "ns"),
        ("9999-12-31", "ns"),
        (np.datetime64("2500-01-01", "s"), "ns"),
        (pd.Timestamp(np.datetime64("1600-01-01", "s")), "ns"),
        (Decimal("1e999999"), "s"),
    ],
)
def test_time_outside_influx_range_is_rejected(value: Any, precision: str) -> None:
    got = reason({"ts": value, "v": 1}, time_column="ts", precision=precision)
    assert "outside InfluxDB's time range" in got or "cannot be parsed" in got
    assert got.startswith("time column 'ts'")


def test_time_range_edges_are_accepted() -> None:
    for stamp in (MIN_TIME_NS, MAX_TIME_NS, 0):
        assert line({"ts": stamp, "v": 1}, time_column="ts") == f"m v=1i {stamp}"
    assert "outside" in reason({"ts": MAX_TIME_NS + 1, "v": 1}, time_column="ts")


def test_clock_stamps_are_strictly_increasing_even_when_the_clock_stalls_or_steps_back() -> None:
    readings = iter([100, 100, 100, 50, 500, 500])
    build = builder(clock=lambda: next(readings))
    stamps = [int(build.line({"v": 1}).rsplit(" ", 1)[1]) for _ in range(6)]
    assert stamps == [100, 101, 102, 103, 500, 501]


def test_rejected_rows_do_not_take_a_clock_stamp() -> None:
    readings = itertools.count(1000, 0)  # a stuck clock
    build = builder(clock=lambda: next(readings))
    items = list(build.convert([{"v": 1}, {"v": None}, {"v": 2}]))
    assert items[0] == "m v=1i 1000" and items[2] == "m v=2i 1001"
    assert isinstance(items[1], Rejected)


def test_clock_is_read_at_conversion_time() -> None:
    now = [10]
    build = builder(clock=lambda: now[0])
    lines = build.convert({"v": i} for i in range(2))
    assert next(lines) == "m v=0i 10"
    now[0] = 99
    assert next(lines) == "m v=1i 99"


# --- series key length --------------------------------------------------------------------


def test_series_key_limit_counts_escaped_utf8_bytes_plus_field_key() -> None:
    # InfluxDB checks len("m,t=<value>") + 4 + len("<field key>") <= 65535; "é" is two
    # bytes, and so is " " escaped.
    room = MAX_SERIES_KEY_BYTES - len("m,t=") - 4 - len("v")
    assert line({"t": "x" * room, "v": 1}, tags=("t",)).startswith("m,t=xxx")
    assert line({"t": "é" * (room // 2), "v": 1}, tags=("t",))
    assert line({"t": " " * (room // 2), "v": 1}, tags=("t",))
    assert room % 2 == 0
    for value in ("x" * (room + 1), "é" * (room // 2) + "x", " " * (room // 2) + "x"):
        got = reason({"t": value, "v": 1}, tags=("t",))
        assert "with field 'v' make a 65536-byte series key" in got
        assert f"over {MAX_SERIES_KEY_BYTES} bytes" in got


def test_series_key_limit_applies_to_each_written_field_key() -> None:
    long_key = "k" * (MAX_SERIES_KEY_BYTES - len("m") - 4)  # just fits
    assert line({long_key: 1}).startswith(f"m {long_key}=1i")
    too_long = long_key + "k"
    assert "series key" in reason({too_long: 1, "v": 1}, null_fields="omit")
    # A null field is not written, so its key does not count.
    assert line({too_long: None, "v": 1}, null_fields="omit") == f"m v=1i {T0}"


# --- convert / Rejected ----------------------------------------------------------------------


def test_convert_yields_one_item_per_row_in_order() -> None:
    values: list[Any] = [1, float("nan"), "s", None, True]
    rows = [{"v": value} for value in values]
    items = list(builder().convert(rows))
    assert items[0] == f"m v=1i {T0}"
    assert items[2] == f'm v="s" {T0 + 1}'
    assert items[4] == f"m v=true {T0 + 2}"
    assert [item.index for item in items if isinstance(item, Rejected)] == [1, 3]
    rejected = items[1]
    assert isinstance(rejected, Rejected)
    assert rejected.reason == "field 'v' is NaN; InfluxDB cannot store NaN or infinite floats"
    assert json.loads(rejected.payload) == {"v": "NaN"}


def test_convert_is_lazy() -> None:
    pulled: list[int] = []

    def rows() -> Iterator[dict[str, int]]:
        for i in itertools.count():
            pulled.append(i)
            yield {"v": i}

    items = builder().convert(rows())
    assert pulled == []
    assert list(itertools.islice(items, 3)) == [f"m v={i}i {T0 + i}" for i in range(3)]
    assert pulled == [0, 1, 2]


def test_line_raises_point_error_a_twophase_error() -> None:
    with pytest.raises(TwoPhaseError) as caught:
        builder().line({"v": []})
    assert isinstance(caught.value, PointError)
    assert caught.value.reason == str(caught.value)


def test_payload_is_the_row_as_json() -> None:
    row = {
        "a": 1,
        "b": "ü",
        "c": None,
        "d": Decimal("1.5"),
        "e": datetime(2024, 1, 1),
        "f": np.int64(3),
        "g": np.float64(0.5),
        "h": b"x",
        "i": [float("inf")],
    }
    assert json.loads(row_payload(row)) == {
        "a": 1,
        "b": "ü",
        "c": None,
        "d": "1.5",
        "e": "2024-01-01 00:00:00",
        "f": 3,
        "g": 0.5,
        "h": "b'x'",
        "i": ["+infinity"],
    }


def test_payload_survives_surrogates_and_non_string_keys() -> None:
    row: dict[Any, Any] = {"s": "a\ud800", 1: 2}
    assert json.loads(row_payload(row)) == {"s": "a\\ud800", "1": 2}


def test_payload_is_truncated_to_64_kib() -> None:
    payload = row_payload({"v": "é" * 100_000})
    assert len(payload.encode("utf-8")) <= MAX_PAYLOAD_BYTES
    assert payload.startswith('{"v": "ééé') and payload.endswith(" ...[truncated]")
    rejected = next(iter(builder().convert([{"v": "é" * 100_000}])))
    assert isinstance(rejected, Rejected) and rejected.payload == payload


# --- properties: randomised -------------------------------------------------------------------

# Characters that line protocol treats specially, plus unicode and the unrepresentable ones.
AWKWARD = [*"ab Z_0,=\"'\\#é☃", "𝄞", "\n", "\r", "\t", "\x00", "\\", "\\", " "]
# The same without the characters that always get a row rejected.
WRITABLE = [char for char in AWKWARD if char not in "\n\r\t\x00"]


def random_text(rnd: random.Random, alphabet: list[str] = AWKWARD, longest: int = 6) -> str:
    return "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, longest)))


def random_value(rnd: random.Random) -> Any:
    return rnd.choice(
        [
            lambda: None,
            lambda: rnd.random() < 0.5,
            lambda: rnd.randint(-(2**63), 2**63 - 1),
            lambda: rnd.randint(-(2**64), 2**64),
            lambda: rnd.uniform(-1e6, 1e6),
            lambda: rnd.choice([float("nan"), float("inf"), 1e300, 5e-324, -0.0, 1e16, 0.1]),
            lambda: random_text(rnd, longest=12),
            lambda: Decimal(rnd.randint(-999, 999)) / 8,
            lambda: np.int32(rnd.randint(-100, 100)),
            lambda: np.float64(rnd.random()),
        ]
    )()


def plain(value: Any) -> Any:
    """What Point should be given for a value the builder accepted."""
    if isinstance(value, Decimal | np.floating):
        return float(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


def point_line(spec: PointSpec, row: Mapping[str, Any], stamp: int) -> str:
    """The reference: influxdb_client.Point's serialisation of the same row."""
    point = Point(spec.measurement)
    for column in spec.tag_columns:
        if row.get(column) is not None:
            point.tag(column, str(row[column]))
    fields = spec.field_columns or [c for c in row if c not in spec.tag_columns]
    for column in fields:
        point.field(column, plain(row[column]))
    return point.time(stamp, WritePrecision.NS).to_line_protocol()


def random_spec(rnd: random.Random) -> PointSpec:
    while True:
        tags = tuple(dict.fromkeys(random_text(rnd) for _ in range(rnd.randint(0, 3))))
        measurement = random_text(rnd) or "m"
        spec = PointSpec(measurement, tags, null_fields=rnd.choice(["reject", "omit"]))
        try:
            spec.validate()
        except ConfigError:
            continue
        return spec


def random_row(rnd: random.Random, spec: PointSpec) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for column in spec.tag_columns:
        row[column] = rnd.choice([None, rnd.randint(0, 9), random_text(rnd, WRITABLE)])
    for _ in range(rnd.randint(1, 4)):
        key = random_text(rnd, rnd.choice([AWKWARD, WRITABLE]))
        if key not in spec.tag_columns:
            row[key] = random_value(rnd)
    return row


def test_output_is_byte_identical_to_influxdb_client_point() -> None:
    rnd = random.Random(20240601)
    accepted = rejected = 0
    for number in range(1000):
        spec = random_spec(rnd)
        newlines = number % 2 == 1  # every other builder takes raw line breaks in strings
        build = PointBuilder(spec, clock_ns=lambda: T0, allow_newlines=newlines)
        for _ in range(20):
            row = random_row(rnd, spec)
            try:
                got = build.line(row)
            except PointError:
                rejected += 1
                continue
            accepted += 1
            assert newlines or ("\n" not in got and "\r" not in got), got
            stamp = int(got.rsplit(" ", 1)[1])
            # Point leaves out null fields; the builder does the same only in "omit" mode.
            expected_row = {k: v for k, v in row.items() if v is not None or k in spec.tag_columns}
            assert got == point_line(spec, expected_row, stamp), row
    print(f"{accepted} rows compared, {rejected} rejected")
    assert accepted > 3000 and rejected > 3000  # both paths really exercised


UNESCAPED_SPACE = re.compile(r"(?<!\\) ")


def sections(line_text: str) -> list[str]:
    """A line without string fields split as InfluxDB's scanner does: at spaces that
    do not follow a backslash."""
    return UNESCAPED_SPACE.split(line_text)


def test_random_unicode_keys_escape_to_one_line_of_three_sections() -> None:
    rnd = random.Random(7)
    everything = [chr(c) for c in (*range(0, 0x250), *range(0x2000, 0x2100), 0xD800, 0x1F600)]
    alphabet = everything + list(' ,="\\\n\r\t')
    written = 0
    for _ in range(3000):
        measurement = random_text(rnd, alphabet) or "m"
        tag, field, value = (random_text(rnd, alphabet) for _ in range(3))
        try:
            spec = PointSpec(measurement, (tag,), (field,))
            got = PointBuilder(spec, clock_ns=lambda: T0).line({tag: value, field: 1.5})
        except (ConfigError, PointError):
            continue
        written += 1
        assert "\n" not in got and "\r" not in got
        got.encode("utf-8")  # strict: no surrogates reach the line
        assert len(sections(got)) == 3, got
        assert sections(got)[1].endswith("=1.5") and sections(got)[2] == str(T0)
    assert written > 300


def influx_scan_lines(body: str) -> list[str]:
    """A port of InfluxDB 1.x's models.scanLine: how a /write body is cut into lines.

    A backslash always skips the next character; the first space outside that
    starts the fields, where an '"' after more '=' than ',' opens or closes a
    string, and a newline inside a string does not end the line.
    """
    lines, start, i = [], 0, 0
    quoted = fields = False
    equals = commas = 0
    while i < len(body):
        char = body[i]
        if char == "\\":
            i += 2
            continue
        fields = fields or char == " "
        if fields and not quoted and char in "=,":
            equals, commas = equals + (char == "="), commas + (char == ",")
        elif fields and char == '"' and equals > commas:
            quoted = not quoted
        elif char == "\n" and not quoted:
            lines.append(body[start:i])
            start, quoted, fields, equals, commas = i + 1, False, False, 0, 0
        i += 1
    return [*lines, body[start:]]


def test_a_batch_of_lines_is_cut_back_into_the_same_lines() -> None:
    # Raw newlines inside string fields and awkward keys must never merge or split
    # lines of a /write body (InfluxDB answers "point is invalid" for the lot).
    rnd = random.Random(11)
    alphabet = [*WRITABLE, '"', '"', "=", ",", "\\", "\n"]
    lines = []
    for _ in range(10_000):
        tags = tuple(dict.fromkeys(random_text(rnd, WRITABLE) for _ in range(2)))
        try:
            build = PointBuilder(  # as for InfluxDB: raw newlines in strings allowed
                PointSpec(random_text(rnd, WRITABLE) or "m", tags),
                clock_ns=lambda: T0,
                allow_newlines=True,
            )
            row = {tag: random_text(rnd, alphabet) for tag in tags}
            row[random_text(rnd, WRITABLE) + "f"] = random_text(rnd, alphabet)
            lines.append(build.line(row))
        except (ConfigError, PointError):
            continue
    assert len(lines) > 1000
    assert sum("\n" in text for text in lines) > 100  # raw newlines inside strings
    assert influx_scan_lines("\n".join(lines)) == lines
