"""Arrow record batches to InfluxDB line protocol, a column at a time.

A [`ColumnarEncoder`][twophase.points.columnar.ColumnarEncoder] gives exactly what its
[`PointBuilder`][twophase.points.builder.PointBuilder] gives for the rows of a batch
(``batch.to_pylist()``), line for line and rejection for rejection, but escapes, formats
and joins whole columns with ``pyarrow.compute`` instead of one Python dict per row.

How it stays byte-identical: every check of the row builder has a vectorised mask here
that is *conservative* (it may flag a row the builder would accept, never miss one it
would refuse or write differently), and the flagged rows, only those, go through the row
builder, which gives their line or their dead letter with today's reason. So a column
mask is only a fast path; the reasons live in one place
([`twophase.points.lineproto`][twophase.points.lineproto]).

Where columnar encoding does not apply, and the row builder does the work:

* a whole batch: a tag, time, measurement or listed field column is missing, column
  names repeat, or the time column is not an integer or Arrow timestamp column (text,
  floats, decimals, dates are parsed per value by
  [`twophase.points.timestamps`][twophase.points.timestamps]);
* a row: a measurement column value that is null, not text, empty, starts with ``#`` or
  holds a backslash, tab, CR, LF or NUL; a tag value that is empty, not text or an
  integer, or holds a backslash, tab, CR, LF or NUL; a field value of a type other than
  bool, integer, float32/64 or text (float16, decimal, temporal, nested...), a NaN or
  infinite float, a uint64 over the int64 range, a string field with NUL, a raw CR/LF
  (unless ``allow_newlines``), or over 64 KiB; a null field with
  ``null_fields='reject'``; no field at all; a field key that cannot be written; a null
  or out-of-range time; a series key that may be too long;
* rows that are not Arrow batches (a PySpark ``Row``, a mapping).

Floats: ``repr`` writes the shortest text that reads back; so does Arrow's cast to text,
but in exponent form from 1e10 up to 1e16 and in decimal form from 1e-9 down to 1e-4,
where ``repr`` does the opposite (and its exponent has two digits): values of those two
ranges are formatted with ``repr`` (a few per batch at most, in real data). Unsigned
Arrow integers are written with ``i`` as the row builder writes them (``to_pylist``
makes them Python ints; the ``u`` suffix is for numpy unsigned scalars).

Clock stamps (no time column): the clock is read once per batch and the accepted rows
take consecutive stamps from it in row order
([`PointBuilder.stamps`][twophase.points.builder.PointBuilder.stamps]), strictly
increasing as the row builder's, and the same stamps as its when the clock stands still.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from twophase.errors import PointError
from twophase.points.builder import (
    MAX_TIME_NS,
    MIN_TIME_NS,
    PRECISIONS,
    PointBuilder,
    Rejected,
    row_payload,
)
from twophase.points.lineproto import (
    ESCAPE_KEY,
    ESCAPE_MEASUREMENT,
    FIELD_KEY_SEPARATOR_BYTES,
    MAX_SERIES_KEY_BYTES,
    MAX_STRING_FIELD_BYTES,
    field_key_problem,
    utf8_size,
)

__all__ = ["ColumnarEncoder", "one_value"]

Item = str | Rejected
Mask = npt.NDArray[np.bool_]  # rows that go by the row builder
_INT64_MAX = 2**63 - 1
# What the row builder refuses or reads back altered in a tag value: any backslash
# (conservative: most backslashes are fine, the row builder decides), tab, CR, LF, NUL.
_TAG_SUSPECT = r"[\\\t\r\n\x00]"
_TAG_ESCAPES = ((",", "\\,"), ("=", "\\="), (" ", "\\ "))  # ESCAPE_KEY's, less those flagged
# A measurement column's values: the same, and a leading '#' (a comment line).
_MEASUREMENT_SUSPECT = r"^#|[\\\t\r\n\x00]"
_MEASUREMENT_ESCAPES = ((",", "\\,"), (" ", "\\ "))  # ESCAPE_MEASUREMENT's, less flagged
# Where Arrow's shortest float text differs in form from repr's (module docstring).
_REPR_RANGES = ((1e-9, 1e-4), (1e10, 1e16))
_TIMESTAMP_NS = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}


def _literal(value: str | bool | int | float, kind: pa.DataType | None = None) -> pa.Scalar:
    """``value`` as an Arrow scalar (a number as ``kind``, from float64 or int64), built
    from its bytes.

    Why not ``pa.scalar`` (or a Python literal given to a compute function, which
    pyarrow converts the same way): its first use in a process imports pandas when
    pandas is installed, to ask whether the value is a pandas object. In a Spark
    task's Python worker that import is a large part of the first micro-batch.
    """
    if isinstance(value, str):
        return one_value(pa.string(), value.encode())[0]
    if isinstance(value, bool):
        made, packed = pa.bool_(), struct.pack("<B", value)
    elif isinstance(value, float):
        made, packed = pa.float64(), struct.pack("<d", value)
    else:
        made, packed = pa.int64(), struct.pack("<q", value)
    scalar = pa.Array.from_buffers(made, 1, [None, pa.py_buffer(packed)])[0]
    return scalar if kind is None or kind == made else scalar.cast(kind)


def one_value(kind: pa.DataType, data: bytes) -> pa.Array:
    """An array of one string or binary value (``kind``), built from its bytes without
    pyarrow's conversion of a Python value (see ``_literal``)."""
    offsets = pa.py_buffer(struct.pack("<ii", 0, len(data)))
    return pa.Array.from_buffers(kind, 1, [None, offsets, pa.py_buffer(data)])


_EMPTY, _SPACE, _QUOTE, _INTEGER = map(_literal, ("", " ", '"', "i"))
_TRUE_TEXT, _FALSE_TEXT = _literal("true"), _literal("false")
_FALSE, _ZERO = _literal(False), _literal(0)


@dataclass(frozen=True)
class _Field:
    """A field column of a batch: its column, its escaped ``key=`` and its key problem."""

    column: str
    prefix: str
    problem: str | None


class ColumnarEncoder:
    """Encodes Arrow record batches with the rules (and the clock) of one row builder.

    Not thread-safe, as its builder. [`convert`][twophase.points.columnar.ColumnarEncoder.convert]
    takes record batches and rows (mappings, PySpark ``Row``) mixed, and yields one item
    per row as [`PointBuilder.convert`][twophase.points.builder.PointBuilder.convert] does.
    """

    def __init__(self, builder: PointBuilder) -> None:
        spec = builder.spec
        self._builder = builder
        self._measurement = spec.measurement.translate(ESCAPE_MEASUREMENT)
        self._tags = tuple(sorted(spec.tag_columns))
        self._time = spec.time_column
        self._unit = PRECISIONS[spec.precision]
        self._omit_nulls = spec.null_fields == "omit"
        self._not_fields = spec.not_fields()
        self._measurement_column = spec.measurement_column

    def convert(self, data: Iterable[Any]) -> Iterator[Item]:
        """One line or Rejected per row, in order; lazy, a batch at a time."""
        index = 0
        for item in data:
            if isinstance(item, pa.RecordBatch):
                yield from self.encode(item, index)
                index += item.num_rows
                continue
            row = item if isinstance(item, Mapping) else item.asDict()
            try:
                yield self._builder.line(row)
            except PointError as exc:
                yield Rejected(index, exc.reason, row_payload(row))
            index += 1

    def encode(self, batch: pa.RecordBatch, start: int = 0) -> list[Item]:
        """The batch's items; a Rejected's index counts from ``start``."""
        fields = self._fields_of(batch.schema)
        if fields is None or (self._time is not None and not _is_time(batch, self._time)):
            return self._by_rows(batch, np.arange(batch.num_rows), start, stamped=True)
        flagged = np.zeros(batch.num_rows, dtype=bool)
        series = self._series(batch, flagged)
        body = self._body(batch, fields, series, flagged)
        if self._time is None:
            return self._clock_stamped(batch, body, flagged, start)
        stamps = self._stamps(batch.column(self._time), flagged)
        lines = _concat(body, _SPACE, stamps)
        return self._merge(batch, lines.to_pylist(), flagged, start)

    # --- the plan of a batch ------------------------------------------------------

    def _fields_of(self, schema: pa.Schema) -> list[_Field] | None:
        """The batch's field columns as the row builder orders them; None when the
        batch as a whole goes by rows."""
        names = schema.names
        spec = self._builder.spec
        wanted = [*self._tags, *(c for c in (self._time, self._measurement_column) if c)]
        if len(set(names)) != len(names) or any(name not in names for name in wanted):
            return None
        if spec.field_columns is None:
            columns = [name for name in names if name not in self._not_fields]
        elif any(name not in names for name in spec.field_columns):
            return None
        else:
            columns = list(spec.field_columns)
        return [
            _Field(name, f"{name.translate(ESCAPE_KEY)}=", field_key_problem(name))
            for name in sorted(columns, key=str)
        ]

    # --- series: measurement and tags ------------------------------------------

    def _series(self, batch: pa.RecordBatch, flagged: Mask) -> pa.Array:
        parts = [self._tag(name, batch.column(name), flagged) for name in self._tags]
        measurement = self._measurement_part(batch, flagged)
        present = [part for part in parts if part is not None]
        if not present:
            if isinstance(measurement, pa.Array):
                return measurement
            return pa.repeat(_literal(self._measurement), batch.num_rows)
        # A null part is a tag left out (null value): it adds nothing.
        return _concat(measurement, *(pc.fill_null(part, _EMPTY) for part in present))

    def _measurement_part(self, batch: pa.RecordBatch, flagged: Mask) -> pa.Scalar | pa.Array:
        """The escaped measurement: one scalar, or each row's from the measurement column
        (null where the row builder decides)."""
        column = self._measurement_column
        if column is None:
            return _literal(self._measurement)
        array = batch.column(column)
        if not (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)):
            flagged[:] = True  # not text: every row is the row builder's rejection
            return pa.nulls(len(array), pa.string())
        return _text_measurement(pc.cast(array, pa.string()), flagged)

    def _tag(self, name: str, array: pa.Array, flagged: Mask) -> pa.Array | None:
        kind = array.type
        prefix = _literal(f",{name.translate(ESCAPE_KEY)}=")
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            return _text_tag(prefix, pc.cast(array, pa.string()), flagged)
        if pa.types.is_integer(kind):  # str(int) and Arrow's text agree; nothing to escape
            return _concat(prefix, pc.cast(array, pa.string()))
        _flag(flagged, pc.is_valid(array))  # str(value) of other types: the row builder
        return None

    # --- fields ------------------------------------------------------------------

    def _body(
        self, batch: pa.RecordBatch, fields: list[_Field], series: pa.Array, flagged: Mask
    ) -> pa.Array:
        parts: list[pa.Array] = []
        written = np.zeros(batch.num_rows, dtype=np.int64)
        for field in fields:
            part = self._field(field, batch.column(field.column), flagged)
            written += _mask(pc.is_valid(part))
            parts.append(part)
        flagged |= written == 0  # no field value at all: the row builder's rejection
        if not parts:
            return series
        longest = max(utf8_size(field.prefix) - 1 for field in fields)
        size = pc.add(pc.binary_length(series), _literal(FIELD_KEY_SEPARATOR_BYTES + longest))
        # May be too long: exact by rows.
        _flag(flagged, pc.greater(size, _literal(MAX_SERIES_KEY_BYTES)))
        # Each part starts with its comma; the first comma becomes the space after the
        # series. (Not null_handling="skip": pyarrow 26 drops the rows whose values are
        # all null from its result.)
        joined = _concat(*(pc.fill_null(part, _EMPTY) for part in parts))
        return _concat(series, _SPACE, pc.utf8_slice_codeunits(joined, 1))

    def _field(self, field: _Field, array: pa.Array, flagged: Mask) -> pa.Array:
        """The field's ``key=value`` texts, null where the field is left out."""
        if not self._omit_nulls:
            _flag(flagged, pc.is_null(array))
        if field.problem is not None:
            _flag(flagged, pc.is_valid(array))  # refused only when it has a value
        # One join per field: its key, its value's text and the text around it.
        return _concat(_literal(f",{field.prefix}"), *self._value_text(array, flagged))

    def _value_text(self, array: pa.Array, flagged: Mask) -> tuple[Any, ...]:
        """The pieces of each value's text: arrays and scalars, null where it is null."""
        kind = array.type
        if pa.types.is_float32(kind) or pa.types.is_float64(kind):
            return (_float_text(array, flagged),)
        if pa.types.is_integer(kind):
            if pa.types.is_uint64(kind):
                _flag(flagged, _above(array, _INT64_MAX))
            return pc.cast(array, pa.string()), _INTEGER
        if pa.types.is_boolean(kind):
            return (pc.if_else(array, _TRUE_TEXT, _FALSE_TEXT),)
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            return self._string_text(pc.cast(array, pa.string()), flagged)
        _flag(flagged, pc.is_valid(array))  # any other type: the row builder decides
        return (pa.nulls(len(array), pa.string()),)

    def _string_text(self, array: pa.Array, flagged: Mask) -> tuple[Any, ...]:
        breaks = r"[\x00]" if self._builder.allow_newlines else r"[\x00\r\n]"
        _flag(flagged, pc.match_substring_regex(array, breaks))
        _flag(flagged, pc.greater(pc.binary_length(array), _literal(MAX_STRING_FIELD_BYTES)))
        escaped = _escape(array, (("\\", "\\\\"), ('"', '\\"')))  # backslashes first
        return _QUOTE, escaped, _QUOTE

    # --- time ----------------------------------------------------------------------

    def _stamps(self, array: pa.Array, flagged: Mask) -> pa.Array:
        """The time column as nanosecond text (rows out of range or null flagged)."""
        unit = self._unit
        if pa.types.is_timestamp(array.type):
            unit = _TIMESTAMP_NS[array.type.unit]
            array = pc.cast(array, pa.int64())
        _flag(flagged, pc.is_null(array))
        low, high = -(-MIN_TIME_NS // unit), MAX_TIME_NS // unit
        outside = _above(array, high)
        if pa.types.is_signed_integer(array.type):  # an unsigned value cannot be too low
            outside = pc.or_(pc.less(pc.cast(array, pa.int64()), _literal(low)), outside)
        _flag(flagged, outside)
        # Values outside are zeroed before the cast and the product: no overflow.
        inside = pc.if_else(outside, _literal(0, array.type), array)
        nanos = pc.multiply(pc.cast(inside, pa.int64()), _literal(unit))
        return pc.cast(nanos, pa.string())

    def _clock_stamped(
        self, batch: pa.RecordBatch, body: pa.Array, flagged: Mask, start: int
    ) -> list[Item]:
        bodies: list[Any] = body.to_pylist()
        rows = np.flatnonzero(flagged)
        for row, item in zip(rows, self._by_rows(batch, rows, start, stamped=False), strict=True):
            bodies[row] = item
        accepted = [index for index, item in enumerate(bodies) if type(item) is str]
        try:
            first = self._builder.stamps(len(accepted)) if accepted else 0
        except PointError:  # the clock is out of range: each row says so
            return self._by_rows(batch, np.arange(batch.num_rows), start, stamped=True)
        for offset, index in enumerate(accepted):
            bodies[index] = f"{bodies[index]} {first + offset}"
        return bodies

    # --- rows the row builder handles ------------------------------------------------

    def _merge(
        self, batch: pa.RecordBatch, lines: list[Any], flagged: Mask, start: int
    ) -> list[Item]:
        rows = np.flatnonzero(flagged)
        for row, item in zip(rows, self._by_rows(batch, rows, start, stamped=True), strict=True):
            lines[row] = item
        return lines

    def _by_rows(
        self, batch: pa.RecordBatch, rows: npt.NDArray[np.intp], start: int, *, stamped: bool
    ) -> list[Item]:
        """The row builder's items for the batch's ``rows`` (lines, or bodies when not
        ``stamped``), with the dead letters it would give."""
        if not len(rows):
            return []
        encode = self._builder.line if stamped else self._builder.body
        items: list[Item] = []
        for row, values in zip(rows.tolist(), batch.take(pa.array(rows)).to_pylist(), strict=True):
            try:
                items.append(encode(values))
            except PointError as exc:
                items.append(Rejected(start + row, exc.reason, row_payload(values)))
        return items


def _text_tag(prefix: pa.Scalar, values: pa.Array, flagged: Mask) -> pa.Array:
    """``,key=value`` of a text tag column. Tag values repeat: each distinct value is
    checked and escaped once (as the row builder's cache does), then spread to its rows."""
    encoded = pc.dictionary_encode(values)
    distinct, rows = encoded.dictionary, encoded.indices
    suspect = pc.or_(
        pc.equal(pc.binary_length(distinct), _ZERO),
        pc.match_substring_regex(distinct, _TAG_SUSPECT),
    )
    _flag(flagged, pc.take(suspect, rows))
    return pc.take(_concat(prefix, _escape(distinct, _TAG_ESCAPES)), rows)


def _text_measurement(values: pa.Array, flagged: Mask) -> pa.Array:
    """Each row's escaped measurement from a text column, each distinct value checked and
    escaped once. Flagged (the row builder decides): null, empty, a leading '#', any
    backslash (conservative, as for tags), tab, CR, LF, NUL."""
    _flag(flagged, pc.is_null(values))
    encoded = pc.dictionary_encode(values)
    distinct, rows = encoded.dictionary, encoded.indices
    suspect = pc.or_(
        pc.equal(pc.binary_length(distinct), _ZERO),
        pc.match_substring_regex(distinct, _MEASUREMENT_SUSPECT),
    )
    _flag(flagged, pc.take(suspect, rows))
    return pc.take(_escape(distinct, _MEASUREMENT_ESCAPES), rows)


def _is_time(batch: pa.RecordBatch, column: str) -> bool:
    kind = batch.schema.field(column).type
    return bool(pa.types.is_integer(kind) or pa.types.is_timestamp(kind))


def _above(array: pa.Array, bound: int) -> pa.Array:
    """``array > bound`` for an integer array of any width and sign (compared in its
    64-bit type: Arrow would cast a uint64 array to int64 and fail on large values)."""
    wide = pa.int64() if pa.types.is_signed_integer(array.type) else pa.uint64()
    return pc.greater(pc.cast(array, wide), _literal(bound, wide))


def _float_text(array: pa.Array, flagged: Mask) -> pa.Array:
    """repr's text of each float (float32 widened, as ``to_pylist`` widens it), ``.0``
    trimmed as Point trims it; NaN and infinities flagged."""
    values = pc.cast(array, pa.float64())
    _flag(flagged, pc.invert(pc.is_finite(values)))
    text = pc.cast(values, pa.string())
    magnitude = pc.abs(values)
    odd = np.zeros(len(values), dtype=bool)
    for low, high in _REPR_RANGES:
        above = pc.greater_equal(magnitude, _literal(low))
        odd |= _mask(pc.and_(above, pc.less(magnitude, _literal(high))))
    if not odd.any():
        return text
    picked = values.filter(pa.array(odd)).to_pylist()
    texts = [_repr_text(value) for value in picked]
    return pc.replace_with_mask(text, pa.array(odd), pa.array(texts, pa.string()))


def _repr_text(value: float) -> str:
    text = repr(value)
    return text[:-2] if text.endswith(".0") else text


def _concat(*parts: Any) -> pa.Array:
    """Texts joined row by row (arrays and scalars, at least one array); null where
    any part is null."""
    return pc.binary_join_element_wise(*parts, _EMPTY)


def _escape(array: pa.Array, pairs: tuple[tuple[str, str], ...]) -> pa.Array:
    for old, new in pairs:
        array = pc.replace_substring(array, old, new)
    return array


def _mask(values: pa.Array) -> Mask:
    """A boolean Arrow array as numpy, null as False: its bits unpacked (``to_numpy`` of a
    boolean array imports pandas, as ``pa.scalar`` does: see ``_literal``)."""
    filled = pc.fill_null(values, _FALSE)
    if not len(filled):
        return np.zeros(0, dtype=bool)
    bits = np.unpackbits(np.frombuffer(filled.buffers()[1], dtype=np.uint8), bitorder="little")
    return bits[filled.offset : filled.offset + len(filled)].astype(bool)


def _flag(flagged: Mask, values: pa.Array) -> None:
    flagged |= _mask(values)
