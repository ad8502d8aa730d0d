"""The columnar encoder against the row builder: for any Arrow batch, the same lines and
the same dead letters (index, reason, payload), item for item."""

from __future__ import annotations

import datetime as dt
import itertools
import math
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st
from influxdb_client import Point, WritePrecision

from tests.fuzz import HOSTILE, any_text, examples, names, plain_names
from tests.fuzz import points as roundtrip_points
from tests.fuzz import rows as fuzz_rows
from twophase.errors import ConfigError
from twophase.points.builder import MAX_TIME_NS, PointBuilder, PointSpec, Rejected
from twophase.points.columnar import ColumnarEncoder

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")

T0 = 1_700_000_000_000_000_000
# Python types Arrow infers a column type from, as Spark's Arrow batches hold them.
ARROW_PLAIN = (type(None), bool, int, float, str, bytes, Decimal, dt.datetime, dt.date)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


texts = any_text.filter(_utf8)
column_names = (names | plain_names | st.sampled_from(["time", "a\\", "k=v", "x y"])).filter(_utf8)
# Floats around the magnitudes where Arrow's text and repr's change form (1e-9, 1e-4,
# 1e10, 1e16), the extremes, and whole floats.
floats = st.one_of(
    st.floats(),
    st.sampled_from(
        [0.0, -0.0, 1e-9, 1e-4, 1e10, 1e16, 5e-324, 1.7976931348623157e308, 1e15, 9.5e-5]
    ).flatmap(
        lambda x: st.sampled_from([x, -x, math.nextafter(x, 0), math.nextafter(x, math.inf)])
    ),
    st.tuples(st.floats(1, 10), st.integers(-12, 18)).map(lambda t: t[0] * 10.0 ** t[1]),
    st.integers(-(2**60), 2**60).map(float),
)
moments = st.datetimes(dt.datetime(1678, 1, 1), dt.datetime(2262, 1, 1))
# Arrow column types with the values that fill them (None is added to each).
VALUE_TYPES: list[tuple[pa.DataType, st.SearchStrategy[Any]]] = [
    (pa.string(), texts | st.sampled_from(["", "a b", "x\ny", "x\r", 'q"\\', *HOSTILE])),
    (pa.large_string(), texts),
    (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    (pa.int8(), st.integers(-128, 127)),
    (pa.uint8(), st.integers(0, 255)),
    (pa.uint64(), st.integers(0, 2**64 - 1)),
    (pa.float64(), floats),
    (pa.float32(), st.floats(width=32)),
    (pa.float16(), st.floats(width=16)),
    (pa.bool_(), st.booleans()),
    (pa.decimal128(20, 4), st.decimals(-(10**15), 10**15, places=4, allow_nan=False)),
    (pa.timestamp("us", tz="UTC"), moments),
    (pa.date32(), st.dates()),
    (pa.binary(), st.binary(max_size=6)),
    (pa.list_(pa.int8()), st.lists(st.integers(-128, 127), max_size=2)),
]
TIME_TYPES: list[tuple[pa.DataType, st.SearchStrategy[Any]]] = [
    (pa.int64(), st.integers(-(2**63), 2**63 - 1) | st.integers(-(2**35), 2**35)),
    (pa.uint64(), st.integers(0, 2**64 - 1) | st.integers(0, 2**35)),
    (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    (pa.timestamp("ns", tz="UTC"), moments),
    (pa.timestamp("us"), st.datetimes()),
    (pa.timestamp("s"), moments),
    (pa.timestamp("ms", tz="+05:30"), moments),
    (pa.string(), st.sampled_from(["2024-01-02T03:04:05Z", "x", "2024-01-02"])),
    (pa.float64(), floats),
]

# A measurement column's types: text above all (hostile names, what is refused), and
# others, whose every row is a dead letter.
MEASUREMENT_TYPES: list[tuple[pa.DataType, st.SearchStrategy[Any]]] = [
    (
        pa.string(),
        column_names
        | texts
        | st.sampled_from(["", "#cpu", "a\\", "a\\ b", "a\\b", "cpu load,x=1", *HOSTILE]),
    ),
    (pa.string(), st.sampled_from(["cpu", "mem", "disk io", "ü"])),  # a few names, repeated
    (pa.large_string(), texts),
    (pa.int64(), st.integers(-5, 5)),
    (pa.binary(), st.binary(max_size=4)),
]


@st.composite
def batches(draw: st.DrawFn) -> tuple[PointSpec, list[pa.RecordBatch], bool, bool]:
    """A spec and one or two batches of one schema for it (sometimes without a column the
    spec names), whether the target takes unsigned integers and raw line breaks."""
    columns = draw(st.lists(column_names, min_size=1, max_size=5, unique=True))
    tags = columns[: draw(st.integers(0, len(columns) - 1))]
    rest = columns[len(tags) :]
    time_column = draw(st.none() | st.sampled_from(rest)) if len(rest) > 1 else None
    fields = [column for column in rest if column != time_column]
    # Sometimes each row's measurement comes from a column of its own.
    by_column = draw(st.integers(0, 2)) == 0
    measurement_column = (
        draw(column_names.filter(lambda n: n not in columns)) if by_column else None
    )
    spec = PointSpec(
        measurement="" if by_column else draw(column_names),
        tag_columns=tuple(tags),
        field_columns=tuple(draw(st.permutations(fields))) if draw(st.booleans()) else None,
        time_column=time_column,
        precision=draw(st.sampled_from(["s", "ms", "us", "ns"])),
        null_fields=draw(st.sampled_from(["reject", "omit"])),
        measurement_column=measurement_column,
    )
    kinds = {
        column: draw(st.sampled_from(TIME_TYPES if column == time_column else VALUE_TYPES))
        for column in columns
    }
    if measurement_column is not None:
        kinds[measurement_column] = draw(st.sampled_from(MEASUREMENT_TYPES))
    if draw(st.integers(0, 19)) == 0:  # a column the spec names is missing
        del kinds[draw(st.sampled_from(list(kinds)))]
    sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=2))
    made = [_batch(draw, kinds, size) for size in sizes]
    return spec, made, draw(st.booleans()), draw(st.booleans())


def _batch(draw: st.DrawFn, kinds: dict[str, Any], size: int) -> pa.RecordBatch:
    arrays = [
        pa.array(draw(st.lists(st.none() | values, min_size=size, max_size=size)), type=kind)
        for kind, values in kinds.values()
    ]
    return pa.RecordBatch.from_arrays(arrays, names=list(kinds))


def both(
    spec: PointSpec, unsigned: bool, newlines: bool, clock: Any = lambda: T0
) -> tuple[PointBuilder, ColumnarEncoder] | None:
    try:
        make = [
            PointBuilder(spec, clock_ns=clock, unsigned=unsigned, allow_newlines=newlines)
            for _ in range(2)
        ]
    except ConfigError:
        event("spec refused")
        return None
    return make[0], ColumnarEncoder(make[1])


def assert_same(
    spec: PointSpec, data: list[pa.RecordBatch], unsigned: bool, newlines: bool
) -> None:
    pair = both(spec, unsigned, newlines)
    if pair is None:
        return
    builder, encoder = pair
    rows = [row for batch in data for row in batch.to_pylist()]
    expected = list(builder.convert(rows))
    got = list(encoder.convert(data))
    assert len(got) == len(expected)
    for index, (ours, theirs) in enumerate(zip(got, expected, strict=True)):
        assert ours == theirs, (index, rows[index])
    event(f"rejected {sum(isinstance(item, Rejected) for item in got) > 0}")


@settings(max_examples=examples(1500))
@given(batches())
@example(
    (
        PointSpec("m", (), None, "t"),
        [pa.record_batch({"t": [1, None], "f": [1.0, 2.0]})],
        False,
        False,
    )
)
@example(
    (PointSpec("m"), [pa.record_batch({"f": pa.array([2**64 - 1, 5], pa.uint64())})], True, False)
)
@example(
    (
        PointSpec("m", ("h",)),
        [pa.record_batch({"h": ["a\\", "b"], "f": [1e15, 1e-5]})],
        False,
        False,
    )
)
@example((PointSpec("m"), [pa.record_batch({"f": ["x\ny", 'q"\\']})], False, True))
@example(
    (
        PointSpec(tag_columns=("h",), measurement_column="m"),
        [
            pa.record_batch(
                {"m": ["a b", None, "", "#x", "a,b", "é\\"], "h": ["x"] * 6, "f": [1] * 6}
            )
        ],
        False,
        False,
    )
)
def test_columnar_output_is_the_row_builders_item_for_item(
    case: tuple[PointSpec, list[pa.RecordBatch], bool, bool],
) -> None:
    assert_same(*case)


@settings(max_examples=examples(600))
@given(st.lists(fuzz_rows() | fuzz_rows(plain=True), min_size=1, max_size=4))
def test_the_fuzzers_rows_as_a_batch_encode_as_the_row_builder_encodes_them(
    cases: list[tuple[PointSpec, dict[str, Any], bool, bool]],
) -> None:
    # The row fuzzer's spec and rows (hostile names and values): the rows that Arrow can
    # hold, in one batch under the first row's spec.
    spec, _, unsigned, newlines = cases[0]
    if not all(type(value) in ARROW_PLAIN for _, row, _, _ in cases for value in row.values()):
        event("not an Arrow batch")  # (pyarrow 26 can crash on some numpy scalars)
        return
    try:
        batch = pa.RecordBatch.from_pylist([row for _, row, _, _ in cases])
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        event("not an Arrow batch")
        return
    assert_same(spec, [batch], unsigned, newlines)


@settings(max_examples=examples(400))
@given(st.sampled_from(["m", "m e,a=s", "ü"]), roundtrip_points())
def test_the_roundtrip_fuzzers_points_encode_as_the_row_builder_encodes_them(
    measurement: str, point: tuple[dict[str, Any], dict[str, Any], int]
) -> None:
    # The InfluxDB round-trip fuzzer's points (accepted there, they read back unchanged).
    tags, fields, stamp = point
    spec = PointSpec(measurement, tuple(tags), tuple(fields), "__time")
    try:
        batch = pa.RecordBatch.from_pylist([{**tags, **fields, "__time": stamp}])
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        event("not an Arrow batch")
        return
    assert_same(spec, [batch], False, True)


def test_clock_stamps_follow_row_order_across_fallback_rows() -> None:
    # Row 1 goes by the row builder (a backslash) and is accepted: its stamp comes between.
    batch = pa.record_batch({"h": ["a", "b\\c", "d"], "f": [1, 2, 3]})
    builder = PointBuilder(PointSpec("m", ("h",)), clock_ns=lambda: T0)
    lines = list(ColumnarEncoder(builder).convert([batch, batch]))
    assert [line.rsplit(" ", 1)[1] for line in lines] == [str(T0 + i) for i in range(6)]


def test_a_moving_clock_gives_strictly_increasing_stamps() -> None:
    ticks = itertools.count(T0, 1000)
    builder = PointBuilder(PointSpec("m"), clock_ns=lambda: next(ticks))
    batch = pa.record_batch({"f": list(range(5))})
    stamps = [int(line.rsplit(" ", 1)[1]) for line in ColumnarEncoder(builder).convert([batch] * 3)]
    assert stamps == sorted(set(stamps))


def test_a_clock_out_of_range_rejects_each_row_as_the_row_builder_does() -> None:
    batch = pa.record_batch({"f": [1, 2]})
    items = list(
        ColumnarEncoder(PointBuilder(PointSpec("m"), clock_ns=lambda: MAX_TIME_NS)).convert([batch])
    )
    expected = list(
        PointBuilder(PointSpec("m"), clock_ns=lambda: MAX_TIME_NS).convert(batch.to_pylist())
    )
    assert items == expected
    assert isinstance(items[1], Rejected) and "clock" in items[1].reason


def test_rows_and_mappings_mixed_with_batches_keep_their_indexes() -> None:
    builder = PointBuilder(PointSpec("m", time_column="t"))
    batch = pa.record_batch({"t": [1, None], "f": [1.5, 2.5]})
    items = list(ColumnarEncoder(builder).convert([{"t": None, "f": 1}, batch, {"t": 3, "f": 1}]))
    assert [item.index for item in items if isinstance(item, Rejected)] == [0, 2]
    assert items[1] == "m f=1.5 1" and items[3] == "m f=1i 3"


@settings(max_examples=examples(1000))
@given(st.lists(floats.filter(math.isfinite), min_size=1, max_size=8))
def test_float_fields_are_written_as_influxdb_clients_point_writes_them(
    values: list[float],
) -> None:
    # The row builder is held to Point for every value (tests/unit/points/test_points.py); the
    # columnar encoder formats floats itself (Arrow's text or repr, by magnitude), so it
    # is held to Point directly too.
    encoder = ColumnarEncoder(PointBuilder(PointSpec("m"), clock_ns=lambda: T0))
    got = encoder.convert([pa.record_batch({"f": pa.array(values, pa.float64())})])
    expected = [
        Point("m").field("f", value).time(T0 + index, WritePrecision.NS).to_line_protocol()
        for index, value in enumerate(values)  # a clock standing still: one ns a row
    ]
    assert list(got) == expected


def test_the_seeds_jobs_output_encodes_as_the_row_builder_encodes_it() -> None:
    # jobs/session_metrics.py's sink: its columns, types and options as the job writes
    # them, an overflowed sum (try_sum's null) among them, 20,000 rows in two batches.
    spec = PointSpec("session_stats", ("stream_id", "isp"), None, "window_end", "s")
    size = 10_000

    def batch(first: int) -> pa.RecordBatch:
        rows = range(first, first + size)
        return pa.record_batch(
            {
                "stream_id": pa.array([f"s{i % 100}" for i in rows]),
                "isp": pa.array([("Orange", "Free", "SFR")[i % 3] for i in rows]),
                "window_end": pa.array([1_764_000_000 + i // 300 * 10 for i in rows]),
                "events": pa.array([i % 500 + 1 for i in rows]),
                "users": pa.array([i % 97 + 1 for i in rows]),
                "bytes_p2p": pa.array([None if i % 1000 == 7 else i * 13 for i in rows]),
                "bytes_cdn": pa.array([i * 7 for i in rows]),
            }
        )

    data = [batch(0), batch(size)]
    rows = [row for part in data for row in part.to_pylist()]
    expected = list(PointBuilder(spec, clock_ns=lambda: T0).convert(rows))
    got = list(ColumnarEncoder(PointBuilder(spec, clock_ns=lambda: T0)).convert(data))
    assert got == expected
    rejected = [item for item in got if isinstance(item, Rejected)]
    assert len(rejected) == 20 and "bytes_p2p" in rejected[0].reason


def test_a_clean_batch_encodes_without_importing_pandas() -> None:
    """pyarrow imports pandas on its first conversion of a Python value; in a Spark
    worker that import costs the first micro-batch, so the common path makes none."""
    import subprocess
    import sys

    batch = pa.record_batch(
        {
            "time": pa.array([dt.datetime(2026, 1, d) for d in (1, 2)], pa.timestamp("us")),
            "host": ["a b", "c"],
            "cpu": [1.5, 2.0],
            "n": pa.array([1, 2], pa.int32()),
            "ok": [True, False],
            "s": ['x"y', "z"],
            "u": pa.array([1, 2], pa.uint64()),
        }
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as out:
        out.write_batch(batch)
    code = (
        "import sys, pyarrow as pa\n"
        "from twophase.points.builder import PointBuilder, PointSpec\n"
        "from twophase.points.columnar import ColumnarEncoder\n"
        "b = pa.ipc.open_stream(sys.stdin.buffer.read()).read_next_batch()\n"
        "spec = PointSpec(measurement='m', tag_columns=('host',), time_column='time',"
        " precision='us')\n"
        "lines = list(ColumnarEncoder(PointBuilder(spec)).convert([b]))\n"
        "print(len(lines), all(type(line) is str for line in lines), 'pandas' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        input=sink.getvalue().to_pybytes(),
        capture_output=True,
        check=True,
    )
    assert done.stdout.decode().split() == ["2", "True", "False"]
