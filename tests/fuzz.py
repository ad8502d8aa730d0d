"""Hypothesis strategies shared by the fuzzing tests: hostile text, any Python, numpy and
Arrow value, rows of them under hostile column names.

Profiles (``HYPOTHESIS_PROFILE``): ``ci``, the default, is derandomized (the same
examples every run) and bounded; ``long`` tries many more, randomly. ``examples(n)``
scales a test's own count with the profile.
"""

from __future__ import annotations

import datetime as dt
import os
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as npst

from twophase.points.builder import MAX_TIME_NS, MIN_TIME_NS, PointSpec

_CI_EXAMPLES = 400
settings.register_profile(
    "ci",
    max_examples=_CI_EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "long",
    max_examples=20_000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def examples(n: int) -> int:
    """``n`` examples in the ci profile, proportionally more in a longer one."""
    return max(1, n * settings.default.max_examples // _CI_EXAMPLES)


# Text that has broken SQL, shells, line protocol or terminals somewhere.
HOSTILE = [
    "'; DROP TABLE twophase_epochs; --",
    '" OR 1=1 --',
    "$$; SELECT pg_sleep(10); $$",
    "\\'",
    "%s %(x)s {0} {}",
    "a,b=c d",
    "q\"uo'te",
    "\\",
    "\\\\ ",
    "e\u0301\u200f\u202e\u2028",
    "😀𝄞☃",
    "\x1b[31mred\x1b[0m",
    "x" * 10_000,
]
# Every code point, surrogates and NUL included: PostgreSQL, UTF-8 and line protocol
# each refuse some of them, and the refusal is what is tested.
any_text = st.text(st.characters(exclude_categories=()), max_size=40) | st.sampled_from(HOSTILE)
names = any_text.filter(bool)

_NUMPY_DTYPES = [
    *("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"),
    *("float16", "float32", "float64", "longdouble", "complex64", "bool"),
    *("datetime64[ns]", "datetime64[D]", "timedelta64[s]", "U12", "S12"),
]
numpy_scalars = st.sampled_from(_NUMPY_DTYPES).flatmap(lambda d: npst.from_dtype(np.dtype(d)))

_TZ = st.sampled_from([None, dt.timezone.utc, dt.timezone(dt.timedelta(hours=-5, minutes=-30))])
python_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.floats(width=32),
    st.decimals(),
    any_text,
    st.integers(65_000, 70_000).map(lambda n: "s" * n),  # around InfluxDB's string limit
    st.binary(max_size=20),
    st.datetimes(timezones=_TZ),
    st.dates(),
    st.times(),
    st.timedeltas(),
    st.complex_numbers(),
    st.just(object()),
)
nested = st.recursive(
    python_scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.dictionaries(any_text, inner, max_size=3)
        | st.frozensets(st.integers(), max_size=3)
    ),
    max_leaves=6,
)


# pyarrow array types with the Python values that fill them.
_ARROW = [
    (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    (pa.uint64(), st.integers(0, 2**64 - 1)),
    (pa.float32(), st.floats(width=32)),
    (pa.float64(), st.floats()),
    (pa.decimal128(38, 9), st.decimals(-(10**20), 10**20, places=9, allow_nan=False)),
    (pa.large_string(), st.text(max_size=30)),
    (pa.binary(), st.binary(max_size=10)),
    (pa.timestamp("ns", tz="UTC"), st.datetimes(dt.datetime(1678, 1, 1), dt.datetime(2262, 1, 1))),
    (pa.timestamp("us"), st.datetimes()),
    (pa.date32(), st.dates()),
    (pa.duration("us"), st.timedeltas(-dt.timedelta(days=10**5), dt.timedelta(days=10**5))),
    (pa.list_(pa.int32()), st.lists(st.integers(-(2**31), 2**31 - 1), max_size=3)),
    (
        pa.struct([("a", pa.int8()), ("b", pa.string())]),
        st.fixed_dictionaries({"a": st.integers(-128, 127), "b": st.text(max_size=3)}),
    ),
    (pa.bool_(), st.booleans()),
]


@st.composite
def arrow_values(draw: st.DrawFn) -> Any:
    """A value as a PySpark Arrow path hands it over: ``to_pylist()``, a pandas
    conversion (numpy scalars, Timestamps, NaT/NaN for nulls), or an Arrow scalar."""
    kind, values = draw(st.sampled_from(_ARROW))
    array = pa.array(draw(st.lists(st.none() | values, min_size=1, max_size=4)), type=kind)
    if kind == pa.float32() and draw(st.booleans()):
        with np.errstate(over="ignore"):  # a float32 beyond float16 becomes infinity
            halves = np.array(array.to_pylist(), dtype=np.float16)
        array = pa.array(halves, type=pa.float16())
    how = draw(st.sampled_from(["pylist", "pandas", "scalar"]))
    if how == "pylist":
        converted = array.to_pylist()
    elif how == "pandas":
        converted = list(array.to_pandas())
    else:
        converted = list(array)
    return draw(st.sampled_from(converted))


any_value = st.one_of(nested, numpy_scalars, arrow_values())
# Time column values: mostly plausible, some absurd.
time_values = st.one_of(
    st.integers(-(2**64), 2**64),
    st.floats(),
    st.datetimes(timezones=_TZ),
    numpy_scalars,
    arrow_values(),
    any_value,
)
tag_values = st.one_of(any_text, st.integers(), st.floats(), st.none(), any_value)
# A measurement column's values: names, hostile text, what is refused, anything at all.
measurement_values = st.one_of(
    names,
    st.sampled_from(["", "#cpu", "cpu\\", "a\\ b", "a,b c=d", "x" * 70_000]),
    st.none(),
    any_value,
)
# Values and names a point usually accepts: most rows of these become lines.
plain_names = st.text(st.characters(exclude_characters="\n\r\t\x00"), min_size=1, max_size=12)
plain_values = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(width=32, allow_nan=False, allow_infinity=False).map(np.float32),
    st.integers(-(2**31), 2**31 - 1).map(np.int32),
    st.booleans(),
    st.text(st.characters(exclude_characters="\x00"), max_size=30),
    st.decimals(-(10**30), 10**30, allow_nan=False),
)


def plain_number(value: Any) -> Any:
    """What InfluxDB reads back for a field value the builder accepted."""
    if isinstance(value, np.float16 | np.float32):
        return float(str(value))  # written as its own shortest text
    if isinstance(value, Decimal | np.floating):
        return float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.str_):
        return str(value)
    return value


@st.composite
def rows(draw: st.DrawFn, plain: bool = False) -> tuple[PointSpec, dict[str, Any], bool, bool]:
    """A spec (hostile measurement and column names included), a row for it, whether
    the target takes unsigned integers, and whether string fields may hold raw line
    breaks. ``plain``: values and names a point usually accepts, so that most rows
    become lines."""
    names_, values = (plain_names, plain_values) if plain else (names, any_value)
    columns = draw(st.lists(names_, min_size=1, max_size=5, unique=True))
    tags = columns[: draw(st.integers(0, len(columns) - 1))]
    fields = columns[len(tags) :]
    time_column = draw(st.none() | names_.filter(lambda n: n not in columns))
    # Sometimes each row's measurement comes from a column (a hostile name too).
    measurement_column = None
    if draw(st.integers(0, 3)) == 0:
        measurement_column = draw(names_.filter(lambda n: n not in (*columns, time_column)))
    spec = PointSpec(
        measurement="" if measurement_column else draw(names_),
        tag_columns=tuple(tags),
        field_columns=tuple(fields) if draw(st.booleans()) else None,
        time_column=time_column,
        precision=draw(st.sampled_from(["s", "ms", "us", "ns"])),
        null_fields=draw(st.sampled_from(["reject", "omit"])),
        measurement_column=measurement_column,
    )
    row = {column: draw(plain_names if plain else tag_values) for column in tags}
    row |= {column: draw(values) for column in fields}
    if measurement_column is not None and draw(st.integers(0, 9)):  # sometimes missing
        row[measurement_column] = draw(names_ if plain else measurement_values)
    if time_column is not None and draw(st.integers(0, 9)):  # sometimes missing
        row[time_column] = draw(st.integers(0, 2**62) if plain else time_values)
    return spec, row, draw(st.booleans()), draw(st.booleans())


# Keys and tag values: plain ones and anything at all (the builder refuses what
# InfluxDB would not give back unchanged; what it accepts must come back).
point_keys = st.one_of(st.text(min_size=1, max_size=10), any_text.filter(bool))
point_values = st.one_of(plain_values, any_text)


@st.composite
def points(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any], int]:
    tag_keys = draw(st.lists(point_keys, max_size=3, unique=True))
    field_keys = draw(
        st.lists(point_keys.filter(lambda k: k not in tag_keys), min_size=1, max_size=3)
    )
    tags = {key: draw(st.one_of(any_text, st.text(min_size=1))) for key in tag_keys}
    fields = {key: draw(point_values) for key in dict.fromkeys(field_keys)}
    return tags, fields, draw(st.integers(MIN_TIME_NS, MAX_TIME_NS))
