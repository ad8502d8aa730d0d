"""``measurement_column``: each row's measurement from a column, so one DataFrame writes
several measurements. Exactly one of ``measurement`` and ``measurement_column``; the
column is no tag, field or time column; a row whose value cannot be a measurement is a
dead letter with the reason, from both encoders alike."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from influxdb_client import Point, WritePrecision

from tests.encoders import ENCODERS, encode
from tests.fuzz import HOSTILE
from twophase.errors import ConfigError
from twophase.points.builder import PointBuilder, PointSpec, Rejected
from twophase.points.columnar import ColumnarEncoder
from twophase.points.lineproto import parse_line
from twophase.spark.foreach import foreach_batch_writer
from twophase.spark.options import check_schema, parse_options
from twophase.spark.staging_task import items_of

T0 = 1_700_000_000_000_000_000
OPTIONS = {"sink_id": "dash", "measurement_column": "metric", "tags": "host", "time": "t"}


@pytest.fixture(autouse=True)
def environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TWOPHASE_STAGING_URL", "postgresql+psycopg://u@localhost/db")
    monkeypatch.setenv("TWOPHASE_TARGET_URL", "http://localhost:8086")
    monkeypatch.delenv("TWOPHASE_CONFIG", raising=False)


def builder(**spec: Any) -> PointBuilder:
    return PointBuilder(PointSpec(measurement_column="m", **spec), clock_ns=lambda: T0)


def refused(options: dict[str, str]) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse_options(options)
    return caught.value


# --- options ---------------------------------------------------------------------


def test_the_sink_option_reads_the_measurement_from_the_column() -> None:
    sink = parse_options(OPTIONS)
    assert sink.spec is not None and sink.spec.measurement_column == "metric"
    assert sink.spec.measurement == ""
    rows = [
        {"metric": "cpu", "host": "a", "t": T0, "v": 1.5},
        {"metric": "disk io", "host": "a", "t": T0, "v": 2},
    ]
    assert list(items_of(sink, rows)) == [f"cpu,host=a v=1.5 {T0}", f"disk\\ io,host=a v=2i {T0}"]


@pytest.mark.parametrize(
    ("options", "option", "words"),
    [
        ({"measurement": "m"}, "measurement_column", "cannot be combined with measurement"),
        ({"measurement_column": None}, "measurement", "is required"),
        ({"measurement_column": " "}, "measurement_column", "not a column name"),
        ({"tags": "metric"}, "measurement_column", "'metric' is also a tag column"),
        ({"time": "metric"}, "measurement_column", "'metric' is also the time column"),
        ({"fields": "v,metric"}, "measurement_column", "'metric' is also a field column"),
        ({"mode": "dead_letters"}, "measurement_column", "only applies to mode=points"),
    ],
)
def test_options_validation_names_the_option(
    options: dict[str, str | None], option: str, words: str
) -> None:
    given = {k: v for k, v in (OPTIONS | options).items() if v is not None}
    if options.get("mode") == "dead_letters":
        given = {"sink_id": "dash", "mode": "dead_letters", "measurement_column": "metric"}
    error = refused(given)
    assert error.option == option, error
    assert words in str(error)


def test_foreach_batch_writer_takes_it_and_refuses_both_or_neither() -> None:
    writer = foreach_batch_writer("dash", measurement_column="metric", tags=["host"])
    assert writer.sink.spec is not None and writer.sink.spec.measurement_column == "metric"
    with pytest.raises(ConfigError) as both:
        foreach_batch_writer("dash", measurement="m", measurement_column="metric")
    assert both.value.option == "measurement_column"
    with pytest.raises(ConfigError) as neither:
        foreach_batch_writer("dash", tags=["host"])
    assert neither.value.option == "measurement"
    with pytest.raises(ConfigError) as clash:
        foreach_batch_writer("dash", measurement_column="host", tags=["host"])
    assert clash.value.option == "measurement_column" and "'host'" in str(clash.value)


def test_the_schema_check_needs_the_column_and_never_takes_it_as_a_field() -> None:
    sink = parse_options(OPTIONS)
    check_schema(sink, ["metric", "host", "t", "v"])
    with pytest.raises(ConfigError) as missing:
        check_schema(sink, ["host", "t", "v"])
    assert missing.value.option == "measurement_column" and "'metric'" in str(missing.value)
    with pytest.raises(ConfigError) as no_fields:
        check_schema(sink, ["metric", "host", "t"])  # the measurement column is not a field
    assert no_fields.value.option == "fields"


def test_the_python_api_spec_takes_exactly_one() -> None:
    PointSpec(measurement_column="m").validate()
    with pytest.raises(ConfigError) as both:
        PointSpec("cpu", measurement_column="m").validate()
    assert both.value.option == "measurement_column"
    with pytest.raises(ConfigError) as neither:
        PointSpec().validate()
    assert neither.value.option == "measurement"


# --- rows --------------------------------------------------------------------------

BAD = [
    ({"v": 1}, "the row has no measurement column 'm'"),
    ({"m": None, "v": 1}, "measurement column 'm' is null"),
    ({"m": "", "v": 1}, "measurement column 'm' is an empty string"),
    ({"m": 7, "v": 1}, "measurement column 'm' value 7 is not a string"),
    ({"m": b"cpu", "v": 1}, "is not a string (bytes)"),
    ({"m": "a\nb", "v": 1}, "contains a newline"),
    ({"m": "a\tb", "v": 1}, "contains a tab"),
    ({"m": "a\x00b", "v": 1}, "contains a NUL"),
    ({"m": "#cpu", "v": 1}, "starts with '#'"),
    ({"m": "cpu\\", "v": 1}, "has a backslash"),
    ({"m": "a\\,b", "v": 1}, "has a backslash"),
    ({"m": "a\ud800", "v": 1}, "lone surrogate"),
    ({"v": 1, "m": "x" * 70_000}, "series key"),
]


@pytest.mark.parametrize(("row", "words"), BAD)
def test_a_row_whose_measurement_cannot_be_written_is_a_dead_letter(
    row: dict[str, Any], words: str
) -> None:
    (item,) = builder().convert([row])
    assert isinstance(item, Rejected) and words in item.reason, item
    assert item.index == 0 and '"v": 1' in item.payload


GOOD = ["cpu", "cpu load", "a,b", "a=b", 'a"b', "a\\b", "ünï ☃ 𝄞", " x ", "x#", "=", "'"]


@pytest.mark.parametrize("encoder", ENCODERS)
def test_both_encoders_write_each_rows_measurement_and_read_it_back(encoder: str) -> None:
    rows = [{"m": name, "h": "a b", "v": index} for index, name in enumerate(GOOD)]
    lines = list(encode(builder(tag_columns=("h",)), rows, encoder))
    assert all(isinstance(line, str) for line in lines), lines
    assert [parse_line(str(line)).measurement for line in lines] == GOOD
    assert lines[1] == f"cpu\\ load,h=a\\ b v=1i {T0 + 1}"
    assert all("m=" not in line for line in lines)  # never a field of its own


@pytest.mark.parametrize("encoder", ENCODERS)
def test_both_encoders_dead_letter_the_same_rows_with_the_same_reasons(encoder: str) -> None:
    values: list[Any] = [*GOOD, *HOSTILE, None, "", "#", "a\\", "a\\ b", "\\\\ ", "x\ry", "é"]
    rows = [{"m": value, "h": "x", "v": 1.5} for value in values]
    got = list(encode(builder(tag_columns=("h",)), rows, encoder))
    expected = list(builder(tag_columns=("h",)).convert(rows))
    assert got == expected
    rejected = [item.index for item in got if isinstance(item, Rejected)]
    assert len(GOOD) not in rejected  # the SQL-looking name is a fine measurement
    assert {values.index(None), values.index(""), values.index("#")} <= set(rejected)


@pytest.mark.parametrize(
    "array",
    [
        pa.array([1, 2, None]),
        pa.array([1.5, None, 2.5]),
        pa.array([b"cpu", b"mem", None]),
        pa.array([True, False, None]),
        pa.array(["cpu", None, "mem"], pa.large_string()),
        pa.array(["cpu", "", "mem"], pa.dictionary(pa.int8(), pa.string())),
    ],
)
def test_a_measurement_column_of_any_arrow_type_encodes_as_the_row_builder(
    array: pa.Array,
) -> None:
    batch = pa.RecordBatch.from_arrays([array, pa.array([1, 2, 3])], names=["m", "v"])
    expected = list(builder().convert(batch.to_pylist()))
    assert list(ColumnarEncoder(builder()).convert([batch])) == expected


def test_a_missing_measurement_column_dead_letters_every_row_in_both_encoders() -> None:
    batch = pa.record_batch({"v": [1, 2]})
    got = list(ColumnarEncoder(builder()).convert([batch]))
    assert got == list(builder().convert(batch.to_pylist()))
    assert all(
        isinstance(item, Rejected) and "no measurement column" in item.reason for item in got
    )


def test_clock_stamps_follow_row_order_around_dead_letters() -> None:
    batch = pa.record_batch({"m": ["a", None, "b", "c\\d"], "v": [1, 2, 3, 4]})
    got = list(ColumnarEncoder(builder()).convert([batch, batch]))
    assert got == list(builder().convert(batch.to_pylist() * 2))
    assert [item for item in got if isinstance(item, str)] == [
        f"a v=1i {T0}",
        f"b v=3i {T0 + 1}",
        f"c\\d v=4i {T0 + 2}",
        f"a v=1i {T0 + 3}",
        f"b v=3i {T0 + 4}",
        f"c\\d v=4i {T0 + 5}",
    ]


@pytest.mark.parametrize("name", [*GOOD, *(h for h in HOSTILE if not h.endswith(("\\", "\\ ")))])
def test_a_measurement_from_a_column_is_escaped_as_influxdb_clients_point_escapes_it(
    name: str,
) -> None:
    row = {"m": name, "h": "a,b", "v": 2.5}
    reference = Point(name).tag("h", "a,b").field("v", 2.5).time(T0, WritePrecision.NS)
    assert builder(tag_columns=("h",)).line(row) == reference.to_line_protocol()
    batch = pa.RecordBatch.from_pylist([row])
    assert list(ColumnarEncoder(builder(tag_columns=("h",))).convert([batch])) == [
        reference.to_line_protocol()
    ]
