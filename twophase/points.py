"""Rows to InfluxDB line protocol, validated at stage time.

A :class:`PointBuilder` turns one row (a mapping of column name to value) into
one line-protocol line with a nanosecond timestamp, or explains in a
:class:`Rejected` why the row cannot become a point. Nothing is ever dropped
silently: every input row yields exactly one line or one rejection, so staged
points plus dead letters always add up to the input.

Timestamps are fixed here, at stage time (DESIGN I8): a row without a time
column gets the builder's clock, so promoting the staged lines again later is
deterministic.

Serialisation reproduces ``influxdb_client.Point.to_line_protocol()`` byte for
byte (same escaping, tag and field order, number formats; the unit tests
compare the two on randomised rows). It is done here rather than by building a
``Point`` per row because escaping keys once per builder instead of once per
row is several times faster, and ``Point`` silently drops what we must reject
(None/NaN/inf fields, empty tags), so every value is validated first anyway.

What InfluxDB 1.6.7 does with awkward text (measured against a real server;
``tests/integration/test_points_roundtrip.py`` keeps checking it):

* spaces, commas, equals signs, quotes and any unicode in the measurement,
  keys and tag values round-trip once escaped;
* a newline, carriage return or tab there cannot be represented: the escaped
  form (``\\n``) is stored as a literal backslash and letter. Inside a string
  field value they are fine (quoted strings may span lines), so **a line may
  contain a raw newline inside a quoted string field**: never split staged
  lines on ``"\\n"``;
* a backslash before a character that is escaped (or at the end) changes
  meaning, because InfluxDB's scanners disagree about what ``\\\\`` means: a
  tag key or value ending in a backslash comes back altered or the whole write
  is refused; in a measurement a backslash before a space, comma, ``=`` or
  ``"`` is lost; in a field key a backslash before ``"`` is lost and an odd run
  of backslashes before a space, comma or ``=`` breaks the line; in a tag key
  or value an odd run before a space makes the line scanner start the fields
  early, and a later ``"`` can then swallow the *following* lines of the batch
  (the line alone is accepted, so only a multi-line write shows it). Those
  names and values are rejected; every other backslash round-trips;
* a measurement starting with ``#`` makes the line a comment (silently
  ignored, HTTP 204), so it is a configuration error;
* a tag or field key ``time`` is refused (partial write);
* NUL characters are accepted by InfluxDB but cannot be stored in
  PostgreSQL text, so they are rejected here rather than failing a whole
  staging COPY.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import date, datetime, timezone
from decimal import ROUND_HALF_EVEN, Decimal, DecimalException, localcontext
from typing import Any

from twophase.errors import ConfigError, TwoPhaseError

try:  # numpy scalars come from pandas / Arrow conversions; numpy itself is optional
    import numpy as np
except ImportError:  # pragma: no cover - numpy ships with the spark extra
    np = None  # type: ignore[assignment]

# Scalar types by role, numpy's included when it is installed.
_BOOL_TYPES: tuple[type[Any], ...] = (bool,) if np is None else (bool, np.bool_)
_INT_TYPES: tuple[type[Any], ...] = (int,) if np is None else (int, np.integer)
_FLOAT_TYPES: tuple[type[Any], ...] = (float,) if np is None else (float, np.floating)
_NUMPY_TIME_TYPES: tuple[type[Any], ...] = () if np is None else (np.datetime64, np.timedelta64)

__all__ = [
    "MAX_PAYLOAD_BYTES",
    "MAX_SERIES_KEY_BYTES",
    "MAX_STRING_FIELD_BYTES",
    "MAX_TIME_NS",
    "MIN_TIME_NS",
    "PRECISIONS",
    "PointBuilder",
    "PointError",
    "PointSpec",
    "Rejected",
    "row_payload",
]

# InfluxDB's valid timestamp range (models.MinNanoTime / MaxNanoTime).
MIN_TIME_NS = -9223372036854775806
MAX_TIME_NS = 9223372036854775806
# InfluxDB's documented limit for a string field value. 1.6.7 stores longer
# strings (measured: 200,000 bytes came back intact); the limit is kept so a
# staged point stays within what InfluxDB promises to accept.
MAX_STRING_FIELD_BYTES = 65535
# models.MaxKeyLength: InfluxDB refuses a point ("max key length exceeded") when
# its escaped series key (measurement and tags, as in the line) plus 4 plus the
# escaped key of any of its fields is longer than this (its TSM key size).
MAX_SERIES_KEY_BYTES = 65535
_FIELD_KEY_SEPARATOR_BYTES = 4
MAX_PAYLOAD_BYTES = 64 * 1024
PRECISIONS: dict[str, int] = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
NULL_FIELD_MODES = ("reject", "omit")

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_NS_PER_DAY = 86_400 * 1_000_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_NAIVE_EPOCH = datetime(1970, 1, 1)
_EPOCH_DATE = date(1970, 1, 1)
_MISSING = object()
_TAG_CACHE_LIMIT = 100_000
_PLAN_CACHE_LIMIT = 64
_PAYLOAD_MARKER = b" ...[truncated]"

# The escape tables of influxdb_client.client.write.point (kept identical so
# the output is byte-identical to Point.to_line_protocol()).
_ESCAPE_MEASUREMENT = str.maketrans({",": r"\,", " ": r"\ ", "\n": r"\n", "\t": r"\t", "\r": r"\r"})
_ESCAPE_KEY = str.maketrans(
    {",": r"\,", "=": r"\=", " ": r"\ ", "\n": r"\n", "\t": r"\t", "\r": r"\r"}
)
_ESCAPE_STRING = str.maketrans({'"': r"\"", "\\": "\\\\"})

# Characters that have no faithful representation in a measurement, key or
# tag value (see the module docstring), and lone surrogates (not UTF-8).
_UNREPRESENTABLE = re.compile("[\n\r\t\x00\ud800-\udfff]")
_CHARACTER_NAMES = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab"}
# Backslashes InfluxDB 1.x reads differently from what Point meant (measured;
# "an odd run" is 1, 3, ... backslashes in the original text).
_MEASUREMENT_BACKSLASH = re.compile(r'\\(?:[ ,="]|\Z)')  # before a space, comma, = or ", or last
_TAG_BACKSLASH = re.compile(r"\\\Z|(?<!\\)\\(?:\\\\)* ")  # last, or an odd run before a space
_TAG_BACKSLASH_PROBLEM = "ends with a backslash or has an odd run of them before a space"
# Both of the above in one search: the common, clean tag value costs one scan.
_TAG_VALUE_SUSPECT = re.compile(f"{_UNREPRESENTABLE.pattern}|{_TAG_BACKSLASH.pattern}")
_FIELD_KEY_BACKSLASH = re.compile(r'\\(?:"|\Z)|(?<!\\)\\(?:\\\\)*[ ,=]')

# ISO-8601 / RFC 3339 with up to nanosecond fractions; no offset means UTC.
_ISO_TIME = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})"
    r"(?:[Tt ](\d{2}):(\d{2})(?::(\d{2})(?:[.,](\d{1,9}))?)?"
    r"(?:([Zz])|([+-])(\d{2})(?::?(\d{2}))?)?)?"
)
_NUMPY_UNIT_NS = {
    "W": 7 * _NS_PER_DAY,
    "D": _NS_PER_DAY,
    "h": 3_600_000_000_000,
    "m": 60_000_000_000,
    "s": 1_000_000_000,
    "ms": 1_000_000,
    "us": 1_000,
    "ns": 1,
}


class PointError(TwoPhaseError):
    """A row cannot become an InfluxDB point; ``reason`` says why, for a person."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True)
class PointSpec:
    """How rows map to points: one measurement, tag columns, field columns, time.

    ``field_columns=None`` takes every column of a row that is not a tag or the
    time column. ``time_column=None`` stamps each row when it is converted
    (DESIGN I8). ``precision`` is the unit of numeric time values;
    ``null_fields`` says whether a null field value dead-letters the row
    (``"reject"``) or is left out of the point (``"omit"``). Lists given for
    the column options are stored as tuples.
    """

    measurement: str
    tag_columns: tuple[str, ...] = ()
    field_columns: tuple[str, ...] | None = None
    time_column: str | None = None
    precision: str = "ns"
    null_fields: str = "reject"

    def __post_init__(self) -> None:
        # Callers naturally pass lists; keep the object hashable and immutable.
        for name in ("tag_columns", "field_columns"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the option when the spec cannot work.

        Column names that could never be written (empty, ``time``, characters
        line protocol cannot carry) are refused here rather than dead-lettering
        every row.
        """
        _check_measurement(self.measurement)
        _check_precision(self.precision)
        _check_null_fields(self.null_fields)
        if self.time_column is not None and (
            not isinstance(self.time_column, str) or not self.time_column
        ):
            raise ConfigError("time", "must be a non-empty column name or None")
        tags = _column_names("tags", self.tag_columns)
        for column in tags:
            _raise_for_key("tags", column, _tag_key_problem(column))
        if self.time_column in tags:
            raise ConfigError("tags", f"{self.time_column!r} is also the time column")
        if self.field_columns is None:
            return
        fields = _column_names("fields", self.field_columns)
        if not fields:
            raise ConfigError("fields", "is empty; leave it unset to use every non-tag column")
        for column in fields:
            _raise_for_key("fields", column, _field_key_problem(column))
        if self.time_column in fields:
            raise ConfigError("fields", f"{self.time_column!r} is also the time column")
        both = sorted(set(fields) & set(tags))
        if both:
            raise ConfigError("fields", f"{', '.join(map(repr, both))} are also tag columns")


@dataclass(frozen=True)
class _FieldPlan:
    """The fields of a key set, sorted as Point sorts them, escaped once."""

    columns: tuple[tuple[str, str, str | None], ...]  # (column, 'escaped key=', key problem)
    longest_key_bytes: int  # for InfluxDB's key size limit

    @classmethod
    def of(cls, columns: Iterable[str]) -> _FieldPlan:
        # key=str: a stray non-string key must dead-letter its rows, not crash the sort.
        planned = tuple(
            (column, f"{str(column).translate(_ESCAPE_KEY)}=", _field_key_problem(column))
            for column in sorted(columns, key=str)
        )
        return cls(planned, max((_utf8_size(prefix) - 1 for _, prefix, _ in planned), default=0))


@dataclass(frozen=True)
class Rejected:
    """A row that cannot become a point, for the dead-letter table."""

    index: int
    reason: str
    payload: str


class PointBuilder:
    """Converts rows of one :class:`PointSpec` to line-protocol lines.

    Not thread-safe (it keeps the last clock stamp and small caches); use one
    builder per task. Rows must be mappings (``dict``; a PySpark ``Row`` via
    ``asDict()``).
    """

    def __init__(self, spec: PointSpec, clock_ns: Callable[[], int] = time.time_ns) -> None:
        spec.validate()
        self.spec = spec
        self._clock_ns = clock_ns
        self._last_stamp = MIN_TIME_NS - 1
        self._time_column = spec.time_column
        self._time_unit = PRECISIONS[spec.precision]
        self._omit_nulls = spec.null_fields == "omit"
        self._measurement = spec.measurement.translate(_ESCAPE_MEASUREMENT)
        # Point sorts tags and fields by key; precompute escaped "key=" once.
        self._tag_plan = tuple(
            (column, f",{column.translate(_ESCAPE_KEY)}=") for column in sorted(spec.tag_columns)
        )
        not_fields = set(spec.tag_columns)
        if spec.time_column is not None:
            not_fields.add(spec.time_column)
        self._not_fields = frozenset(not_fields)
        self._fixed_fields = (
            None if spec.field_columns is None else _FieldPlan.of(spec.field_columns)
        )
        self._plans: dict[tuple[str, ...], _FieldPlan] = {}
        # Tag values repeat (low cardinality): validate and escape each once.
        self._tag_cache: dict[str, str] = {}

    def convert(self, rows: Iterable[Mapping[str, Any]]) -> Iterator[str | Rejected]:
        """One item per input row, in order: its line (no trailing newline) or a Rejected.

        Lazy: rows are read one at a time as the result is iterated.
        """
        for index, row in enumerate(rows):
            item: str | Rejected
            try:
                item = self.line(row)
            except PointError as exc:
                item = Rejected(index, exc.reason, row_payload(row))
            yield item

    def line(self, row: Mapping[str, Any]) -> str:
        """The row's line-protocol line; raises :class:`PointError` with the reason."""
        series = self._measurement + self._tags(row)
        plan = self._fixed_fields
        if plan is None:
            plan = self._discovered_plan(row)
        fields = self._fields(row, plan)
        # Only long keys can exceed the limit (a character is at most 4 bytes).
        if len(series) * 4 + _FIELD_KEY_SEPARATOR_BYTES + plan.longest_key_bytes > (
            MAX_SERIES_KEY_BYTES
        ):
            _check_key_size(series, row, plan)
        return f"{series} {fields} {self._timestamp(row)}"

    def _tags(self, row: Mapping[str, Any]) -> str:
        parts: list[str] = []
        cache = self._tag_cache
        for column, prefix in self._tag_plan:
            value = row.get(column, _MISSING)
            if type(value) is not str:
                if value is None:
                    continue  # a null tag is simply absent, as in InfluxDB
                value = _tag_text(column, value)
                if value is None:
                    continue
            escaped = cache.get(value)
            if escaped is None:
                escaped = _escaped_tag_value(column, value)
                if len(cache) >= _TAG_CACHE_LIMIT:
                    cache.clear()
                cache[value] = escaped
            parts.append(prefix)
            parts.append(escaped)
        return "".join(parts)

    def _fields(self, row: Mapping[str, Any], plan: _FieldPlan) -> str:
        parts: list[str] = []
        for column, prefix, key_problem in plan.columns:
            value = row.get(column, _MISSING)
            text = _field_text(column, value)
            if text is None:
                if self._omit_nulls:
                    continue
                raise PointError(
                    f"field {column!r} is null; fix the data or set null_fields='omit' "
                    "to leave null fields out"
                )
            if key_problem is not None:
                raise PointError(key_problem)
            parts.append(prefix + text)
        if not parts:
            raise PointError(f"the row has no field values (field columns: {_names(plan)})")
        return ",".join(parts)

    def _discovered_plan(self, row: Mapping[str, Any]) -> _FieldPlan:
        # Rows of one batch share a schema, so the plan is computed once per key set.
        keys = tuple(row)
        plan = self._plans.get(keys)
        if plan is None:
            if len(self._plans) >= _PLAN_CACHE_LIMIT:
                self._plans.clear()
            plan = _FieldPlan.of(key for key in keys if key not in self._not_fields)
            self._plans[keys] = plan
        return plan

    def _timestamp(self, row: Mapping[str, Any]) -> int:
        column = self._time_column
        if column is None:
            return self._stamp()
        value = row.get(column, _MISSING)
        if type(value) is int:
            stamp = value * self._time_unit
        elif type(value) is datetime:
            stamp = _datetime_ns(value)
        else:
            stamp = _time_ns(column, value, self._time_unit)
        if not MIN_TIME_NS <= stamp <= MAX_TIME_NS:
            raise PointError(
                f"time column {column!r} value {_show(value)} is outside InfluxDB's time range "
                "(1677-09-21T00:12:43.145224194Z .. 2262-04-11T23:47:16.854775806Z)"
            )
        return stamp

    def _stamp(self) -> int:
        # Strictly increasing, so rows of one series never collapse onto one
        # timestamp (InfluxDB would keep only the last of them).
        now = self._clock_ns()
        stamp = now if now > self._last_stamp else self._last_stamp + 1
        if not MIN_TIME_NS <= stamp <= MAX_TIME_NS:
            raise PointError(f"the clock gave {now}, outside InfluxDB's time range")
        self._last_stamp = stamp
        return stamp


def row_payload(row: Mapping[str, Any]) -> str:
    """The row as JSON for the dead-letter table, at most 64 KiB of UTF-8.

    Non-JSON values are written with ``str()``; NaN and infinities as strings.
    A longer payload is cut and ends with `` ...[truncated]`` (no longer JSON).
    """
    try:
        text = json.dumps(dict(row), default=_json_default, ensure_ascii=False, allow_nan=False)
        data = text.encode("utf-8")
    except (TypeError, ValueError, RecursionError):
        # NaN/inf, non-string keys, cycles or lone surrogates: make it plain.
        data = json.dumps(_jsonable(row, 0), default=_json_default).encode("utf-8")
    if len(data) <= MAX_PAYLOAD_BYTES:
        return data.decode("utf-8")
    cut = data[: MAX_PAYLOAD_BYTES - len(_PAYLOAD_MARKER)]
    return (cut + _PAYLOAD_MARKER).decode("utf-8", "ignore")


# --- spec checks -------------------------------------------------------------


def _check_measurement(measurement: object) -> None:
    if not isinstance(measurement, str) or not measurement:
        raise ConfigError("measurement", "must be a non-empty string")
    problem = _unrepresentable(measurement)
    if problem is None and measurement.startswith("#"):
        problem = "starts with '#', which makes every line a comment InfluxDB ignores"
    if problem is None and _MEASUREMENT_BACKSLASH.search(measurement):
        problem = (
            "has a backslash before a space, comma, '=', '\"' or at the end, "
            "which InfluxDB does not read back unchanged"
        )
    escaped = measurement.translate(_ESCAPE_MEASUREMENT)
    # The shortest series key: the measurement, a separator and a 1-byte field key.
    if problem is None and (
        _utf8_size(escaped) + _FIELD_KEY_SEPARATOR_BYTES + 1 > MAX_SERIES_KEY_BYTES
    ):
        problem = f"is longer than InfluxDB's {MAX_SERIES_KEY_BYTES}-byte key limit allows"
    if problem is not None:
        raise ConfigError("measurement", f"{_show(measurement)} {problem}")


def _check_precision(precision: object) -> None:
    if precision not in PRECISIONS:
        raise ConfigError("precision", f"{precision!r} is not one of {', '.join(PRECISIONS)}")


def _check_null_fields(mode: object) -> None:
    if mode not in NULL_FIELD_MODES:
        raise ConfigError("null_fields", f"{mode!r} is not one of {', '.join(NULL_FIELD_MODES)}")


def _column_names(option: str, columns: object) -> tuple[str, ...]:
    if isinstance(columns, str) or not isinstance(columns, tuple | list):
        raise ConfigError(option, f"must be a list of column names, not {_show(columns)}")
    for column in columns:
        if not isinstance(column, str) or not column:
            raise ConfigError(option, f"{column!r} is not a column name (empty or not a string)")
    duplicates = sorted({column for column in columns if columns.count(column) > 1})
    if duplicates:
        raise ConfigError(option, f"{', '.join(map(repr, duplicates))} listed more than once")
    return tuple(columns)


def _raise_for_key(option: str, column: str, problem: str | None) -> None:
    if problem is not None:
        raise ConfigError(option, problem)


# --- key and value checks ----------------------------------------------------


def _unrepresentable(text: str) -> str | None:
    match = _UNREPRESENTABLE.search(text)
    if match is None:
        return None
    char = match.group()
    if char == "\x00":
        return "contains a NUL character, which the PostgreSQL staging store cannot hold"
    if char in _CHARACTER_NAMES:
        return f"contains {_CHARACTER_NAMES[char]}, which line protocol cannot carry there"
    return "contains a lone surrogate, which is not valid UTF-8"


def _tag_key_problem(key: str) -> str | None:
    return _key_problem("tag", key, _TAG_BACKSLASH, _TAG_BACKSLASH_PROBLEM)


def _field_key_problem(key: str) -> str | None:
    return _key_problem(
        "field",
        key,
        _FIELD_KEY_BACKSLASH,
        "has a backslash before '\"', at the end, or (an odd run of them) before "
        "a space, comma or '='",
    )


def _key_problem(kind: str, key: str, backslash: re.Pattern[str], what: str) -> str | None:
    if not isinstance(key, str):
        return f"{kind} key {_show(key)} is not a string; name the column with a string"
    if not key:
        return f"{kind} key '' is empty; InfluxDB needs a name (rename the column)"
    if key == "time":
        hint = " (set time_column='time' if it holds the timestamp)" if kind == "field" else ""
        return f"{kind} key 'time' is refused by InfluxDB 1.x; rename the column{hint}"
    problem = _unrepresentable(key)
    if problem is None and backslash.search(key):
        problem = f"{what}, which InfluxDB does not read back unchanged"
    if problem is None:
        return None
    return f"{kind} key {_show(key)} {problem}; rename the column"


def _tag_text(column: str, value: object) -> str | None:
    """A non-str tag value as text, or None when it is null (the tag is left out)."""
    if value is _MISSING:
        raise PointError(f"the row has no tag column {column!r}")
    if _is_null(value):
        return None
    if isinstance(value, _FLOAT_TYPES) and math.isnan(value):
        raise PointError(f"tag {column!r} is NaN; use null to leave the tag out")
    return str(value)


def _escaped_tag_value(column: str, value: str) -> str:
    if value and _TAG_VALUE_SUSPECT.search(value) is None:
        return value.translate(_ESCAPE_KEY)
    if not value:
        raise PointError(
            f"tag {column!r} is an empty string, which InfluxDB cannot store; "
            "use null to leave the tag out"
        )
    problem = _unrepresentable(value)
    if problem is None and _TAG_BACKSLASH.search(value):
        problem = f"{_TAG_BACKSLASH_PROBLEM}, which InfluxDB does not read back unchanged"
    if problem is not None:
        raise PointError(f"tag {column!r} value {_show(value)} {problem}")
    return value.translate(_ESCAPE_KEY)


def _check_key_size(series: str, row: Mapping[str, Any], plan: _FieldPlan) -> None:
    """InfluxDB's limit on measurement, tags and each written field key together."""
    series_bytes = _utf8_size(series) + _FIELD_KEY_SEPARATOR_BYTES
    for column, prefix, _ in plan.columns:
        size = series_bytes + _utf8_size(prefix) - 1
        if size > MAX_SERIES_KEY_BYTES and _field_text(column, row[column]) is not None:
            raise PointError(
                f"the measurement and tags with field {column!r} make a {size}-byte series "
                f"key (escaped); InfluxDB refuses keys over {MAX_SERIES_KEY_BYTES} bytes"
            )


def _utf8_size(text: str) -> int:
    return len(text.encode("utf-8"))


def _field_text(column: str, value: Any) -> str | None:
    """The line-protocol text of a field value, None when null; raises PointError."""
    kind = type(value)
    if kind is float:
        if value - value != 0.0:  # NaN or +-inf, without a function call
            raise PointError(
                f"field {column!r} is {_float_name(value)}; InfluxDB cannot store NaN or "
                "infinite floats"
            )
        text = repr(value)
        # Point trims the ".0" of whole floats; without an "i" it is still a float.
        return text[:-2] if text.endswith(".0") else text
    if kind is str:
        return _string_text(column, value)
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise PointError(f"field {column!r} value {value} does not fit a 64-bit integer")
        return f"{value}i"
    if value is None:
        return None
    return _field_text(column, _plain_field_value(column, value))


def _string_text(column: str, value: str) -> str:
    if "\x00" in value:
        raise PointError(
            f"field {column!r} contains a NUL character, which the PostgreSQL staging "
            "store cannot hold"
        )
    # An ASCII string is one byte per character; isascii() is O(1) in CPython.
    if not value.isascii() or len(value) > MAX_STRING_FIELD_BYTES:
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            raise PointError(
                f"field {column!r} contains a lone surrogate, which is not valid UTF-8"
            ) from None
        if size > MAX_STRING_FIELD_BYTES:
            raise PointError(
                f"field {column!r} is a {size}-byte string; InfluxDB limits string "
                f"fields to {MAX_STRING_FIELD_BYTES} bytes"
            )
    return f'"{value.translate(_ESCAPE_STRING)}"'


def _plain_field_value(column: str, value: Any) -> bool | int | float | str | None:
    """numpy scalars, Decimal and subclasses as plain bool/int/float/str; None if null."""
    if value is _MISSING:
        raise PointError(f"the row has no field column {column!r}")
    if _is_null(value):
        return None
    if isinstance(value, _BOOL_TYPES):
        return bool(value)
    if isinstance(value, _NUMPY_TIME_TYPES):  # numpy counts them as integers: not here
        raise PointError(
            f"field {column!r} has unsupported type {type(value).__name__} ({_show(value)}); "
            "a field must be a bool, int, float, Decimal or str"
        )
    if isinstance(value, Decimal):
        return _decimal_float(column, value)
    if isinstance(value, _INT_TYPES):
        return int(value)
    if isinstance(value, _FLOAT_TYPES):
        return float(value)
    if isinstance(value, str):
        return str.__str__(value)
    raise PointError(
        f"field {column!r} has unsupported type {type(value).__name__} ({_show(value)}); "
        "a field must be a bool, int, float, Decimal or str"
    )


def _decimal_float(column: str, value: Decimal) -> float:
    if not value.is_finite():
        raise PointError(f"field {column!r} is Decimal {value}; InfluxDB cannot store it")
    result = float(value)
    if math.isinf(result):
        raise PointError(f"field {column!r} value {value} is too large for a float")
    return result


def _is_null(value: Any) -> bool:
    if value is None:
        return True
    kind = type(value)
    # pandas.NA / pandas.NaT, matched by name so pandas need not be imported.
    if kind.__name__ in ("NAType", "NaTType") and kind.__module__.startswith("pandas"):
        return True
    return isinstance(value, _NUMPY_TIME_TYPES) and bool(np.isnat(value))


# --- time ----------------------------------------------------------------------


def _datetime_ns(value: datetime) -> int:
    """Exact nanoseconds since the epoch; a naive datetime is UTC."""
    if value.tzinfo is None:
        delta = value - _NAIVE_EPOCH
    elif value.utcoffset() is None:  # a tzinfo that knows no offset: naive too
        delta = value.replace(tzinfo=None) - _NAIVE_EPOCH
    else:
        delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000


def _time_ns(column: str, value: Any, unit: int) -> int:
    """The time column's value in nanoseconds (may be out of range); raises PointError."""
    if value is _MISSING:
        raise PointError(f"the row has no time column {column!r}")
    if _is_null(value):
        raise PointError(f"time column {column!r} is null")
    try:
        stamp = _parse_time(value, unit)
    except (ValueError, OverflowError, DecimalException):
        stamp = None
    if stamp is None:
        kind = "" if isinstance(value, str) else f" ({type(value).__name__})"
        raise PointError(f"time column {column!r} cannot be parsed as a time: {_show(value)}{kind}")
    return stamp


def _parse_time(value: Any, unit: int) -> int | None:
    """Nanoseconds, or None for a value that is not a time."""
    if isinstance(value, _BOOL_TYPES + _NUMPY_TIME_TYPES[1:]):
        return None  # booleans and durations are integers to Python/numpy, not times
    if isinstance(value, datetime):
        nanos = getattr(value, "asm8", None)  # pandas Timestamp: keeps its nanoseconds
        if nanos is not None:
            return _numpy_time_ns(nanos)
        return _datetime_ns(value)
    if isinstance(value, date):
        return (value - _EPOCH_DATE).days * _NS_PER_DAY
    if isinstance(value, str):
        return _iso_ns(value)
    if isinstance(value, _NUMPY_TIME_TYPES[:1]):
        return _numpy_time_ns(value)
    if isinstance(value, _INT_TYPES):
        return int(value) * unit
    if isinstance(value, _FLOAT_TYPES):
        value = float(value)
        if not math.isfinite(value):
            return None
        value = Decimal(repr(value))  # the number as written, not its binary neighbour
    if isinstance(value, Decimal):
        if not value.is_finite():
            return None
        with localcontext() as context:
            context.prec = 60  # exact for any in-range time
            return int((value * unit).to_integral_value(rounding=ROUND_HALF_EVEN))
    return None


def _numpy_time_ns(value: Any) -> int | None:
    unit, count = np.datetime_data(value.dtype)
    if unit in ("Y", "M"):  # calendar units: let numpy find the day
        value, unit, count = value.astype("datetime64[D]"), "D", 1
    if unit not in _NUMPY_UNIT_NS:
        return None
    return int(value.astype("int64")) * count * _NUMPY_UNIT_NS[unit]


def _iso_ns(text: str) -> int | None:
    match = _ISO_TIME.fullmatch(text)
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction = match.group(1, 2, 3, 4, 5, 6, 7)
    moment = datetime(
        int(year),
        int(month),
        int(day),
        int(hour or 0),
        int(minute or 0),
        int(second or 0),
        tzinfo=timezone.utc,
    )
    stamp = _datetime_ns(moment) + (int(fraction.ljust(9, "0")) if fraction else 0)
    sign, offset_hours, offset_minutes = match.group(9, 10, 11)
    if sign is None:  # "Z" or no offset: UTC
        return stamp
    hours, minutes = int(offset_hours), int(offset_minutes or 0)
    if hours > 23 or minutes > 59:
        return None
    offset_ns = (hours * 3_600 + minutes * 60) * 1_000_000_000
    return stamp - offset_ns if sign == "+" else stamp + offset_ns


# --- small helpers --------------------------------------------------------------


def _show(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _float_name(value: float) -> str:
    return "NaN" if math.isnan(value) else ("+infinity" if value > 0 else "-infinity")


def _json_default(value: Any) -> Any:
    # numpy numbers as JSON numbers; anything else (Decimal, datetime...) as text.
    if isinstance(value, _BOOL_TYPES + _INT_TYPES + _FLOAT_TYPES) and not isinstance(
        value, _NUMPY_TIME_TYPES
    ):
        return value.item()
    return str(value)


def _names(plan: _FieldPlan) -> str:
    return ", ".join(repr(column) for column, _, _ in plan.columns) or "none"


def _jsonable(value: Any, depth: int) -> Any:
    if depth > 20:
        return str(value)
    if isinstance(value, Mapping):
        return {str(key): _jsonable(item, depth + 1) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(item, depth + 1) for item in value]
    if isinstance(value, _FLOAT_TYPES) and not math.isfinite(value):
        return _float_name(value)
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value
