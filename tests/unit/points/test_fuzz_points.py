"""Fuzzing the point builder: whatever a row holds, a row becomes a line or a rejection
with a reason -- never another exception -- and every line reads back as the row."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st
from influxdb_client import Point

from tests.fuzz import examples, plain_number, rows
from twophase.errors import ConfigError
from twophase.points.builder import PointBuilder, PointSpec, Rejected
from twophase.points.lineproto import field_text, is_null, parse_line

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")


def builder_for(spec: PointSpec, unsigned: bool, newlines: bool = False) -> PointBuilder | None:
    try:
        return PointBuilder(
            spec,
            clock_ns=lambda: 1_700_000_000_000_000_000,
            unsigned=unsigned,
            allow_newlines=newlines,
        )
    except ConfigError as exc:  # a bad measurement or column name: the sink's definition
        assert exc.option in ("measurement", "measurement_column", "tags", "fields", "time"), exc
        event("spec refused")
        return None


@settings(max_examples=examples(1500))
@given(rows() | rows(plain=True))
@example((PointSpec("m", ("t",)), {"t": np.float32("nan"), "f": 1}, False, False))
@example((PointSpec("m", (), None, "ts"), {"ts": np.datetime64("NaT"), "f": 1.5}, False, False))
@example((PointSpec("m"), {"f": np.uint64(2**64 - 1)}, True, False))
@example((PointSpec("0"), {"\ud800": 0}, False, False))  # found by the long profile
@example((PointSpec("m"), {"f": np.uint64(2**64 - 1)}, False, False))
@example((PointSpec("m"), {"f": "x\nm2 g=1 1\n"}, False, False))  # a point inside a value
@example((PointSpec("m"), {"f": "x\r\nm2 g=1 1"}, False, True))
@example((PointSpec(measurement_column="m"), {"m": "a b,c", "f": 1}, False, False))
@example((PointSpec(measurement_column="m"), {"m": np.str_("cpu"), "f": 1}, False, False))
def test_a_row_becomes_a_line_or_a_rejection_with_a_reason(
    case: tuple[PointSpec, dict[str, Any], bool, bool],
) -> None:
    spec, row, unsigned, newlines = case
    builder = builder_for(spec, unsigned, newlines)
    if builder is None:
        return
    (item,) = builder.convert([row])
    if isinstance(item, Rejected):
        event("rejected")
        assert isinstance(item.reason, str) and item.reason.strip()
        assert isinstance(item.payload, str) and "\x00" not in item.payload
        return
    event("accepted")
    if not newlines:  # by default a line is one line for every reader of line protocol
        assert "\n" not in item and "\r" not in item, item
    check_reads_back(spec, row, item)


def check_reads_back(spec: PointSpec, row: dict[str, Any], line: str) -> None:
    parsed = parse_line(line)
    column = spec.measurement_column
    assert parsed.measurement == (spec.measurement if column is None else row[column])
    tags = {c: row[c] for c in spec.tag_columns if not is_null(row.get(c))}
    assert dict(parsed.tags) == {c: v if isinstance(v, str) else str(v) for c, v in tags.items()}
    taken = set(spec.field_columns or set(row) - spec.not_fields())
    for column, value in parsed.fields.items():
        assert column in taken
        assert same_value(value, row[column]), (column, value, row[column])
    assert parsed.time_ns is not None


def same_value(parsed: Any, original: Any) -> bool:
    expected = plain_number(original)
    if isinstance(expected, bool) or isinstance(parsed, bool):
        return parsed is expected
    if isinstance(expected, float) and isinstance(parsed, float):
        return parsed == expected or (parsed == 0.0 and expected == 0.0)
    if isinstance(expected, float):  # a whole float is written without ".0": still a float
        return math.isclose(parsed, expected)
    return bool(parsed == expected)


@settings(max_examples=examples(400))
@given(
    st.one_of(
        st.floats(width=16, allow_nan=False, allow_infinity=False).map(np.float16),
        st.floats(width=32, allow_nan=False, allow_infinity=False).map(np.float32),
        st.floats(allow_nan=False, allow_infinity=False).map(np.float64),
        st.floats(allow_nan=False, allow_infinity=False),
    )
)
@example(np.float32(0.1))
@example(np.float16(65504))
@example(np.float32(-0.0))
def test_floats_are_written_as_influxdb_client_point_writes_them(value: Any) -> None:
    ours = field_text("f", value)
    theirs = Point("m").field("f", value).to_line_protocol()
    assert f"m f={ours}" == theirs
