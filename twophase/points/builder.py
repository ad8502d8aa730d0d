"""Rows to InfluxDB line protocol, validated at stage time.

A [`PointBuilder`][twophase.points.builder.PointBuilder] turns one row (a mapping of column
name to value) into one line-protocol line with a nanosecond timestamp, or explains in a
[`Rejected`][twophase.points.builder.Rejected] why the row cannot become a point. Nothing is
ever dropped silently: every input row yields exactly one line or one rejection, so staged
points plus dead letters always add up to the input.

Arrow record batches, what Spark hands a staging task, are encoded a column at a time
by [`ColumnarEncoder`][twophase.points.columnar.ColumnarEncoder], which gives this
builder's lines and rejections byte for byte. This builder does the work where columnar
encoding cannot apply: rows that are not Arrow batches (a PySpark ``Row``, a mapping),
a batch whose time column is text, float, decimal or date (parsed per value) or lacks a
column the spec names, and, one row at a time, the rows the encoder's masks flag (every
row that is rejected, and a few awkward ones: the list is in
[`twophase.points.columnar`][twophase.points.columnar]). So every check and every
reason is here, once.

Timestamps are fixed here, at stage time (DESIGN I8): a row without a time
column gets the builder's clock, so promoting the staged lines again later is
deterministic.

Serialisation reproduces ``influxdb_client.Point.to_line_protocol()`` byte for
byte (same escaping, tag and field order, number formats; the unit tests
compare the two on randomised rows). It is done here rather than by building a
``Point`` per row because escaping keys once per builder instead of once per
row is several times faster, and ``Point`` silently drops what we must reject
(None/NaN/inf fields, empty tags), so every value is validated first anyway.
The escaping and the key and value checks are in
[`twophase.points.lineproto`][twophase.points.lineproto],
time parsing in [`twophase.points.timestamps`][twophase.points.timestamps].

What InfluxDB 1.6.7 does with awkward text (measured against a real server;
``tests/integration/test_points_roundtrip.py`` keeps checking it):

* spaces, commas, equals signs, quotes and any unicode in the measurement,
  keys and tag values round-trip once escaped;
* a newline, carriage return or tab there cannot be represented: the escaped
  form (``\\n``) is stored as a literal backslash and letter. Inside a string
  field value InfluxDB reads them as they are (quoted strings may span lines),
  but VictoriaMetrics, which takes the same writes, ends a line at every
  newline, so a value such as ``"x\\nadmin,host=prod cpu=99 ..."`` would add a
  point of its own there. A raw line feed or carriage return in a string field
  therefore dead-letters the row, unless the builder is made with
  ``allow_newlines`` (the setting ``allow_newlines_in_strings``, for targets that
  are all InfluxDB); then **a line may contain a raw newline inside a quoted
  string field**: never split staged lines on ``"\\n"``;
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
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from twophase.bounded import SizedCache
from twophase.errors import ConfigError, PointError
from twophase.points.lineproto import (
    BOOL_TYPES,
    ESCAPE_KEY,
    ESCAPE_MEASUREMENT,
    FIELD_KEY_SEPARATOR_BYTES,
    FLOAT_TYPES,
    INT_TYPES,
    MAX_SERIES_KEY_BYTES,
    MAX_STRING_FIELD_BYTES,
    MISSING,
    NUMPY_TIME_TYPES,
    escaped_measurement,
    escaped_tag_value,
    field_key_problem,
    field_text,
    float_name,
    measurement_problem,
    show,
    tag_key_problem,
    tag_text,
    utf8_size,
)
from twophase.points.timestamps import datetime_ns, time_ns

__all__ = [
    "MAX_PAYLOAD_BYTES",
    "MAX_SERIES_KEY_BYTES",
    "MAX_STRING_FIELD_BYTES",
    "MAX_TIME_NS",
    "MIN_TIME_NS",
    "PRECISIONS",
    "PointBuilder",
    "PointSpec",
    "Rejected",
    "cut_payload",
    "row_payload",
]

# InfluxDB's valid timestamp range (models.MinNanoTime / MaxNanoTime).
MIN_TIME_NS = -9223372036854775806
MAX_TIME_NS = 9223372036854775806
MAX_PAYLOAD_BYTES = 64 * 1024
PRECISIONS: dict[str, int] = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
NULL_FIELD_MODES = ("reject", "omit")

# A builder's caches of what it computes from its rows, counted in bytes
# (twophase.bounded): escaped tag values (16 MiB: about 100,000 values of 20 characters),
# escaped values of a measurement column (1 MiB: a few names, a column of unique names
# refills it), and field plans by the rows' key sets. An entry over its cache's max is
# computed again each time: large unique values would fill the cache and never hit.
TAG_CACHE_BYTES = 16 * 1024 * 1024
TAG_ENTRY_BYTES = 1024
MEASUREMENT_CACHE_BYTES = 1024 * 1024
PLAN_CACHE_BYTES = 2 * 1024 * 1024
PLAN_ENTRY_BYTES = 1024 * 1024
_PAYLOAD_MARKER = b" ...[truncated]"


@dataclass(frozen=True)
class PointSpec:
    """How rows map to points: the measurement, tag columns, field columns, time.

    The measurement is either one name for every row (``measurement``) or the
    column that holds each row's (``measurement_column``): exactly one of the two
    is given. A row whose measurement column is null, empty, not a string or not a
    name InfluxDB reads back unchanged is rejected with the reason.
    ``field_columns=None`` takes every column of a row that is not a tag, the time
    or the measurement column. ``time_column=None`` stamps each row when it is
    converted (DESIGN I8). ``precision`` is the unit of numeric time values;
    ``null_fields`` says whether a null field value dead-letters the row
    (``"reject"``) or is left out of the point (``"omit"``). Lists given for
    the column options are stored as tuples.
    """

    measurement: str = ""
    tag_columns: tuple[str, ...] = ()
    field_columns: tuple[str, ...] | None = None
    time_column: str | None = None
    precision: str = "ns"
    null_fields: str = "reject"
    measurement_column: str | None = None

    def __post_init__(self) -> None:
        # Callers naturally pass lists; keep the object hashable and immutable.
        for name in ("tag_columns", "field_columns"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))

    def validate(self) -> None:
        """Raise [`ConfigError`][twophase.errors.ConfigError] naming the option when the spec cannot
        work.

        Column names that could never be written (empty, ``time``, characters
        line protocol cannot carry) are refused here rather than dead-lettering
        every row.
        """
        if self.measurement_column is None or self.measurement:
            _check_measurement(self.measurement, given_column=self.measurement_column)
        _check_precision(self.precision)
        _check_null_fields(self.null_fields)
        if self.time_column is not None and (
            not isinstance(self.time_column, str) or not self.time_column
        ):
            raise ConfigError("time", "must be a non-empty column name or None")
        tags = _column_names("tags", self.tag_columns)
        for column in tags:
            _raise_for_key("tags", column, tag_key_problem(column))
        if self.time_column in tags:
            raise ConfigError("tags", f"{self.time_column!r} is also the time column")
        _check_measurement_column(self.measurement_column, tags, self.time_column)
        if self.field_columns is not None:
            self._check_fields(tags)

    def _check_fields(self, tags: tuple[str, ...]) -> None:
        fields = _column_names("fields", self.field_columns)
        if not fields:
            raise ConfigError("fields", "is empty; leave it unset to use every non-tag column")
        for column in fields:
            _raise_for_key("fields", column, field_key_problem(column))
        if self.time_column in fields:
            raise ConfigError("fields", f"{self.time_column!r} is also the time column")
        both = sorted(set(fields) & set(tags))
        if both:
            raise ConfigError("fields", f"{', '.join(map(repr, both))} are also tag columns")
        if self.measurement_column in fields:
            raise ConfigError(
                "measurement_column", f"{self.measurement_column!r} is also a field column"
            )

    def not_fields(self) -> frozenset[str]:
        """The columns that are never fields: tags, the time and the measurement column."""
        return frozenset(
            (*self.tag_columns, *(c for c in (self.time_column, self.measurement_column) if c))
        )


@dataclass(frozen=True)
class _FieldPlan:
    """The fields of a key set, sorted as Point sorts them, escaped once."""

    columns: tuple[tuple[str, str, str | None], ...]  # (column, 'escaped key=', key problem)
    longest_key_bytes: int  # for InfluxDB's key size limit

    @classmethod
    def of(cls, columns: Iterable[str]) -> _FieldPlan:
        # key=str: a stray non-string key must dead-letter its rows, not crash the sort.
        planned = tuple(
            (column, f"{str(column).translate(ESCAPE_KEY)}=", field_key_problem(column))
            for column in sorted(columns, key=str)
        )
        return cls(planned, max((utf8_size(prefix) - 1 for _, prefix, _ in planned), default=0))


@dataclass(frozen=True)
class Rejected:
    """A row that cannot become a point, for the dead-letter table."""

    index: int
    reason: str
    payload: str


class PointBuilder:
    """Converts rows of one [`PointSpec`][twophase.points.builder.PointSpec] to line-protocol lines.

    Not thread-safe (it keeps the last clock stamp and small caches); use one
    builder per task. Rows must be mappings (``dict``; a PySpark ``Row`` via
    ``asDict()``). ``unsigned``: the target (the 2.x API) takes numpy unsigned
    integers with the ``u`` suffix; otherwise they are refused (1.x cannot).
    ``allow_newlines``: a string field value may hold a raw line feed or
    carriage return, which InfluxDB reads inside the quotes; otherwise (the
    default) the row is refused, since VictoriaMetrics would end the line there
    and read the rest of the value as points (the Spark sink sets it from
    ``allow_newlines_in_strings``).
    """

    def __init__(
        self,
        spec: PointSpec,
        clock_ns: Callable[[], int] = time.time_ns,
        *,
        unsigned: bool = False,
        allow_newlines: bool = False,
    ) -> None:
        spec.validate()
        self.spec = spec
        self._unsigned = unsigned
        self._newlines = allow_newlines
        self._clock_ns = clock_ns
        self._last_stamp = MIN_TIME_NS - 1
        self._time_column = spec.time_column
        self._time_unit = PRECISIONS[spec.precision]
        self._omit_nulls = spec.null_fields == "omit"
        self._measurement = spec.measurement.translate(ESCAPE_MEASUREMENT)
        self._measurement_column = spec.measurement_column
        # Point sorts tags and fields by key; precompute escaped "key=" once.
        self._tag_plan = tuple(
            (column, f",{column.translate(ESCAPE_KEY)}=") for column in sorted(spec.tag_columns)
        )
        self._not_fields = spec.not_fields()
        self._fixed_fields = (
            None if spec.field_columns is None else _FieldPlan.of(spec.field_columns)
        )
        self._plans: SizedCache[tuple[str, ...], _FieldPlan] = SizedCache(
            PLAN_CACHE_BYTES, PLAN_ENTRY_BYTES
        )
        # Tag values repeat (low cardinality): validate and escape each once.
        self._tag_cache: SizedCache[str, str] = SizedCache(TAG_CACHE_BYTES, TAG_ENTRY_BYTES)
        # Measurement column values repeat as much (a handful of names): the same.
        self._measurement_cache: SizedCache[str, str] = SizedCache(
            MEASUREMENT_CACHE_BYTES, TAG_ENTRY_BYTES
        )

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

    @property
    def unsigned(self) -> bool:
        """Whether numpy unsigned integers are written with the ``u`` suffix."""
        return self._unsigned

    @property
    def allow_newlines(self) -> bool:
        """Whether a string field value may hold a raw line feed or carriage return."""
        return self._newlines

    def line(self, row: Mapping[str, Any]) -> str:
        """The row's line-protocol line; raises [`PointError`][twophase.errors.PointError] with the
        reason."""
        return f"{self.body(row)} {self._timestamp(row)}"

    def body(self, row: Mapping[str, Any]) -> str:
        """The row's line without its timestamp (series and fields), checked as
        [`line`][twophase.points.builder.PointBuilder.line] checks them; for an encoder that
        stamps clock-stamped rows itself ([`stamps`][twophase.points.builder.PointBuilder.stamps]).
        """
        column = self._measurement_column
        measurement = self._measurement if column is None else self._measurement_of(column, row)
        series = measurement + self._tags(row)
        plan = self._fixed_fields
        if plan is None:
            plan = self._discovered_plan(row)
        fields = self._fields(row, plan)
        # Only long keys can exceed the limit (a character is at most 4 bytes).
        if len(series) * 4 + FIELD_KEY_SEPARATOR_BYTES + plan.longest_key_bytes > (
            MAX_SERIES_KEY_BYTES
        ):
            _check_key_size(series, row, plan)
        return f"{series} {fields}"

    def _measurement_of(self, column: str, row: Mapping[str, Any]) -> str:
        value = row.get(column, MISSING)
        escaped = self._measurement_cache.entries.get(value) if type(value) is str else None
        if escaped is None:
            escaped = escaped_measurement(column, value)  # raises for a bad value
            text = str(value)
            self._measurement_cache.put(text, escaped, len(text) + len(escaped))
        return escaped

    def _tags(self, row: Mapping[str, Any]) -> str:
        parts: list[str] = []
        cache = self._tag_cache.entries  # read as a plain dict: a hit is one lookup
        for column, prefix in self._tag_plan:
            value = row.get(column, MISSING)
            if type(value) is not str:
                if value is None:
                    continue  # a null tag is simply absent, as in InfluxDB
                value = tag_text(column, value)
                if value is None:
                    continue
            escaped = cache.get(value)
            if escaped is None:
                escaped = escaped_tag_value(column, value)
                self._tag_cache.put(value, escaped, len(value) + len(escaped))
            parts.append(prefix)
            parts.append(escaped)
        return "".join(parts)

    def _fields(self, row: Mapping[str, Any], plan: _FieldPlan) -> str:
        parts: list[str] = []
        for column, prefix, key_problem in plan.columns:
            value = row.get(column, MISSING)
            text = field_text(column, value, self._unsigned, self._newlines)
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
        plan = self._plans.entries.get(keys)
        if plan is None:
            plan = _FieldPlan.of(key for key in keys if key not in self._not_fields)
            self._plans.put(keys, plan, _plan_size(keys, plan))
        return plan

    def _timestamp(self, row: Mapping[str, Any]) -> int:
        column = self._time_column
        if column is None:
            return self._stamp()
        value = row.get(column, MISSING)
        if type(value) is int:
            stamp = value * self._time_unit
        elif type(value) is datetime:
            stamp = datetime_ns(value)
        else:
            stamp = time_ns(column, value, self._time_unit)
        if not MIN_TIME_NS <= stamp <= MAX_TIME_NS:
            raise PointError(
                f"time column {column!r} value {show(value)} is outside InfluxDB's time range "
                "(1677-09-21T00:12:43.145224194Z .. 2262-04-11T23:47:16.854775806Z)"
            )
        return stamp

    def stamps(self, count: int) -> int:
        """The first of ``count`` consecutive clock stamps, taken as ``count`` calls of
        ``line`` on rows without a time column would take them, but reading the clock once
        (a stalled clock gives the same stamps); raises PointError outside InfluxDB's range."""
        before = self._last_stamp
        first = self._stamp()
        last = first + count - 1
        if last > MAX_TIME_NS:
            self._last_stamp = before
            raise PointError(f"the clock gave {last}, outside InfluxDB's time range")
        self._last_stamp = last
        return first

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
    return cut_payload(data)


def cut_payload(data: bytes) -> str:
    """UTF-8 ``data`` as a dead letter's payload: at most 64 KiB, a longer one cut and
    ending with `` ...[truncated]``."""
    if len(data) <= MAX_PAYLOAD_BYTES:
        return data.decode("utf-8")
    cut = data[: MAX_PAYLOAD_BYTES - len(_PAYLOAD_MARKER)]
    return (cut + _PAYLOAD_MARKER).decode("utf-8", "ignore")


# --- spec checks -------------------------------------------------------------


def _check_measurement(measurement: object, given_column: str | None = None) -> None:
    if given_column is not None:
        raise ConfigError(
            "measurement_column",
            "cannot be combined with measurement: give one name for every row "
            "(measurement) or the column that holds each row's (measurement_column)",
        )
    if not isinstance(measurement, str) or not measurement:
        raise ConfigError(
            "measurement",
            "must be a non-empty string: the measurement to write "
            "(or set measurement_column, the column holding each row's)",
        )
    problem = measurement_problem(measurement)
    escaped = measurement.translate(ESCAPE_MEASUREMENT)
    # The shortest series key: the measurement, a separator and a 1-byte field key.
    if problem is None and (
        utf8_size(escaped) + FIELD_KEY_SEPARATOR_BYTES + 1 > MAX_SERIES_KEY_BYTES
    ):
        problem = f"is longer than InfluxDB's {MAX_SERIES_KEY_BYTES}-byte key limit allows"
    if problem is not None:
        raise ConfigError("measurement", f"{show(measurement)} {problem}")


def _check_measurement_column(
    column: object, tags: tuple[str, ...], time_column: str | None
) -> None:
    """The column that holds each row's measurement: a name, no tag or time column
    (its clash with listed fields is checked with them)."""
    if column is None:
        return
    if not isinstance(column, str) or not column:
        raise ConfigError("measurement_column", f"{column!r} is not a column name")
    if column in tags:
        raise ConfigError("measurement_column", f"{column!r} is also a tag column")
    if column == time_column:
        raise ConfigError("measurement_column", f"{column!r} is also the time column")


def _check_precision(precision: object) -> None:
    if precision not in PRECISIONS:
        raise ConfigError("precision", f"{precision!r} is not one of {', '.join(PRECISIONS)}")


def _check_null_fields(mode: object) -> None:
    if mode not in NULL_FIELD_MODES:
        raise ConfigError("null_fields", f"{mode!r} is not one of {', '.join(NULL_FIELD_MODES)}")


def _column_names(option: str, columns: object) -> tuple[str, ...]:
    if isinstance(columns, str) or not isinstance(columns, tuple | list):
        raise ConfigError(option, f"must be a list of column names, not {show(columns)}")
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


# --- row checks ----------------------------------------------------------------


def _check_key_size(series: str, row: Mapping[str, Any], plan: _FieldPlan) -> None:
    """InfluxDB's limit on measurement, tags and each written field key together."""
    series_bytes = utf8_size(series) + FIELD_KEY_SEPARATOR_BYTES
    for column, prefix, _ in plan.columns:
        size = series_bytes + utf8_size(prefix) - 1
        # Only a field the line holds counts (the value was accepted: just its null-ness).
        if size > MAX_SERIES_KEY_BYTES and (
            field_text(column, row[column], True, True) is not None
        ):
            raise PointError(
                f"the measurement and tags with field {column!r} make a {size}-byte series "
                f"key (escaped); InfluxDB refuses keys over {MAX_SERIES_KEY_BYTES} bytes"
            )


# --- small helpers --------------------------------------------------------------


def _json_default(value: Any) -> Any:
    # numpy numbers as JSON numbers; anything else (Decimal, datetime...) as text.
    if isinstance(value, BOOL_TYPES + INT_TYPES + FLOAT_TYPES) and not isinstance(
        value, NUMPY_TIME_TYPES
    ):
        item = value.item()  # a longdouble's is itself (found by fuzzing): endless
        return item if type(item) is not type(value) else str(value)
    return str(value)


def _plan_size(keys: tuple[str, ...], plan: _FieldPlan) -> int:
    """A plan cache entry's bytes: the key set and, per field, its name, its escaped key
    and the tuple that holds them (rare: once per key set, so measured exactly)."""
    names = sum(sys.getsizeof(key) for key in keys)
    fields = sum(sys.getsizeof(planned) + sys.getsizeof(planned[1]) for planned in plan.columns)
    return sys.getsizeof(keys) + names + fields


def _names(plan: _FieldPlan) -> str:
    return ", ".join(repr(column) for column, _, _ in plan.columns) or "none"


def _jsonable(value: Any, depth: int) -> Any:
    if depth > 20:
        return str(value)
    if isinstance(value, Mapping):
        return {str(key): _jsonable(item, depth + 1) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(item, depth + 1) for item in value]
    if isinstance(value, FLOAT_TYPES) and not math.isfinite(value):
        return float_name(value)
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value
