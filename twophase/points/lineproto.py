"""InfluxDB line protocol: writing it (escaping, checks on keys and values) and reading it.

The helpers [`twophase.points.builder`][twophase.points.builder] builds its lines with: the
escape tables of ``influxdb_client`` (so lines match ``Point.to_line_protocol()`` byte for
byte), the checks that refuse names and values InfluxDB 1.x would not store or read back
unchanged (why each is refused is in the
[`twophase.points.builder`][twophase.points.builder] docstring), and the formatting of field
values. A bad value raises [`PointError`][twophase.errors.PointError].

[`parse_line`][twophase.points.lineproto.parse_line] reads a line back (``twophase verify``
rebuilds what InfluxDB should hold from staged lines); it raises
[`LineProtocolError`][twophase.errors.LineProtocolError] for text that is not a line.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from twophase.errors import LineProtocolError, PointError

try:  # numpy scalars come from pandas / Arrow conversions; numpy itself is optional
    import numpy as np
except ImportError:  # pragma: no cover - numpy ships with the spark extra
    np = None  # type: ignore[assignment]

# Scalar types by role, numpy's included when it is installed.
BOOL_TYPES: tuple[type[Any], ...] = (bool,) if np is None else (bool, np.bool_)
INT_TYPES: tuple[type[Any], ...] = (int,) if np is None else (int, np.integer)
FLOAT_TYPES: tuple[type[Any], ...] = (float,) if np is None else (float, np.floating)
NUMPY_TIME_TYPES: tuple[type[Any], ...] = () if np is None else (np.datetime64, np.timedelta64)
UNSIGNED_TYPES: tuple[type[Any], ...] = () if np is None else (np.unsignedinteger,)
# float16 and float32 are written as their own shortest text, as influxdb-client's Point
# writes them ("0.1"), not widened to float64 first ("0.10000000149011612").
NARROW_FLOAT_TYPES: tuple[type[Any], ...] = () if np is None else (np.float16, np.float32)

# InfluxDB's documented limit for a string field value. 1.6.7 stores longer
# strings (measured: 200,000 bytes came back intact); the limit is kept so a
# staged point stays within what InfluxDB promises to accept.
MAX_STRING_FIELD_BYTES = 65535
# models.MaxKeyLength: InfluxDB refuses a point ("max key length exceeded") when
# its escaped series key (measurement and tags, as in the line) plus 4 plus the
# escaped key of any of its fields is longer than this (its TSM key size).
MAX_SERIES_KEY_BYTES = 65535
FIELD_KEY_SEPARATOR_BYTES = 4

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
MISSING = object()

# The escape tables of influxdb_client.client.write.point (kept identical so
# the output is byte-identical to Point.to_line_protocol()).
ESCAPE_MEASUREMENT = str.maketrans({",": r"\,", " ": r"\ ", "\n": r"\n", "\t": r"\t", "\r": r"\r"})
ESCAPE_KEY = str.maketrans(
    {",": r"\,", "=": r"\=", " ": r"\ ", "\n": r"\n", "\t": r"\t", "\r": r"\r"}
)
ESCAPE_STRING = str.maketrans({'"': r"\"", "\\": "\\\\"})

# Characters that have no faithful representation in a measurement, key or
# tag value (see the twophase.points.builder docstring), and lone surrogates (not UTF-8).
_UNREPRESENTABLE = re.compile("[\n\r\t\x00\ud800-\udfff]")
_CHARACTER_NAMES = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab"}
# Backslashes InfluxDB 1.x reads differently from what Point meant (measured;
# "an odd run" is 1, 3, ... backslashes in the original text).
MEASUREMENT_BACKSLASH = re.compile(r'\\(?:[ ,="]|\Z)')  # before a space, comma, = or ", or last
_TAG_BACKSLASH = re.compile(r"\\\Z|(?<!\\)\\(?:\\\\)* ")  # last, or an odd run before a space
_TAG_BACKSLASH_PROBLEM = "ends with a backslash or has an odd run of them before a space"
# Both of the above in one search: the common, clean tag value costs one scan.
_TAG_VALUE_SUSPECT = re.compile(f"{_UNREPRESENTABLE.pattern}|{_TAG_BACKSLASH.pattern}")
_FIELD_KEY_BACKSLASH = re.compile(r'\\(?:"|\Z)|(?<!\\)\\(?:\\\\)*[ ,=]')


# --- key and value checks ----------------------------------------------------


def unrepresentable(text: str) -> str | None:
    match = _UNREPRESENTABLE.search(text)
    if match is None:
        return None
    char = match.group()
    if char == "\x00":
        return "contains a NUL character, which the PostgreSQL staging store cannot hold"
    if char in _CHARACTER_NAMES:
        return f"contains {_CHARACTER_NAMES[char]}, which line protocol cannot carry there"
    return "contains a lone surrogate, which is not valid UTF-8"


def tag_key_problem(key: str) -> str | None:
    return _key_problem("tag", key, _TAG_BACKSLASH, _TAG_BACKSLASH_PROBLEM)


def field_key_problem(key: str) -> str | None:
    return _key_problem(
        "field",
        key,
        _FIELD_KEY_BACKSLASH,
        "has a backslash before '\"', at the end, or (an odd run of them) before "
        "a space, comma or '='",
    )


def _key_problem(kind: str, key: str, backslash: re.Pattern[str], what: str) -> str | None:
    if not isinstance(key, str):
        return f"{kind} key {show(key)} is not a string; name the column with a string"
    if not key:
        return f"{kind} key '' is empty; InfluxDB needs a name (rename the column)"
    if key == "time":
        hint = " (set time_column='time' if it holds the timestamp)" if kind == "field" else ""
        return f"{kind} key 'time' is refused by InfluxDB 1.x; rename the column{hint}"
    problem = unrepresentable(key)
    if problem is None and backslash.search(key):
        problem = f"{what}, which InfluxDB does not read back unchanged"
    if problem is None:
        return None
    return f"{kind} key {show(key)} {problem}; rename the column"


def tag_text(column: str, value: object) -> str | None:
    """A non-str tag value as text, or None when it is null (the tag is left out)."""
    if value is MISSING:
        raise PointError(f"the row has no tag column {column!r}")
    if is_null(value):
        return None
    if isinstance(value, FLOAT_TYPES) and math.isnan(value):
        raise PointError(f"tag {column!r} is NaN; use null to leave the tag out")
    return str(value)


def escaped_tag_value(column: str, value: str) -> str:
    if value and _TAG_VALUE_SUSPECT.search(value) is None:
        return value.translate(ESCAPE_KEY)
    if not value:
        raise PointError(
            f"tag {column!r} is an empty string, which InfluxDB cannot store; "
            "use null to leave the tag out"
        )
    problem = unrepresentable(value)
    if problem is None and _TAG_BACKSLASH.search(value):
        problem = f"{_TAG_BACKSLASH_PROBLEM}, which InfluxDB does not read back unchanged"
    if problem is not None:
        raise PointError(f"tag {column!r} value {show(value)} {problem}")
    return value.translate(ESCAPE_KEY)


def measurement_problem(measurement: str) -> str | None:
    """Why ``measurement`` (a non-empty string) cannot be written as a measurement name,
    or None. The key size limit is checked with the whole series key."""
    problem = unrepresentable(measurement)
    if problem is None and measurement.startswith("#"):
        problem = "starts with '#', which makes every line a comment InfluxDB ignores"
    if problem is None and MEASUREMENT_BACKSLASH.search(measurement):
        problem = (
            "has a backslash before a space, comma, '=', '\"' or at the end, "
            "which InfluxDB does not read back unchanged"
        )
    return problem


def escaped_measurement(column: str, value: object) -> str:
    """A measurement column's value as the escaped measurement of a line; raises
    PointError when it cannot be one (missing, null, not a string, empty, or a name
    InfluxDB would not read back unchanged)."""
    if value is MISSING:
        raise PointError(f"the row has no measurement column {column!r}")
    if is_null(value):
        raise PointError(f"measurement column {column!r} is null; every row needs a measurement")
    if not isinstance(value, str):
        raise PointError(
            f"measurement column {column!r} value {show(value)} is not a string "
            f"({type(value).__name__}); a measurement is a name"
        )
    if not value:
        raise PointError(
            f"measurement column {column!r} is an empty string; InfluxDB needs a measurement name"
        )
    problem = measurement_problem(value)
    if problem is not None:
        raise PointError(f"measurement column {column!r} value {show(value)} {problem}")
    return str(value).translate(ESCAPE_MEASUREMENT)


def utf8_size(text: str) -> int:
    # surrogatepass: a name with a lone surrogate still has a size (found by fuzzing);
    # its own check dead-letters the row.
    return len(text.encode("utf-8", "surrogatepass"))


def field_text(
    column: str, value: Any, unsigned: bool = False, newlines: bool = False
) -> str | None:
    """The line-protocol text of a field value, None when null; raises PointError.

    With ``unsigned`` (the 2.x write API) numpy unsigned integers are written
    with the ``u`` suffix; without it (1.x ``/write``, which answers "invalid
    number") they are refused. With ``newlines`` a string may hold a raw
    carriage return or line feed (InfluxDB reads it inside the quotes); without
    it (the default) such a string is refused, since other readers of line
    protocol (VictoriaMetrics) end the line there and read the rest of the
    value as points of its own.
    """
    kind = type(value)
    if kind is float:
        if value - value != 0.0:  # NaN or +-inf, without a function call
            raise PointError(
                f"field {column!r} is {float_name(value)}; InfluxDB cannot store NaN or "
                "infinite floats"
            )
        text = repr(value)
        # Point trims the ".0" of whole floats; without an "i" it is still a float.
        return text[:-2] if text.endswith(".0") else text
    if kind is str:
        return _string_text(column, value, newlines)
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise PointError(f"field {column!r} value {value} does not fit a 64-bit integer")
        return f"{value}i"
    if value is None:
        return None
    return _converted_field_text(column, value, unsigned, newlines)


def _converted_field_text(column: str, value: Any, unsigned: bool, newlines: bool) -> str | None:
    """A value of no plain type (numpy scalars, Decimal, subclasses), converted first.

    Kept out of [`field_text`][twophase.points.lineproto.field_text], whose plain types are
    the common case and are tested first, without a call.
    """
    if isinstance(value, float):  # numpy's float64 (a float subclass): the common numpy case
        return field_text(column, float(value))
    if isinstance(value, UNSIGNED_TYPES):
        return _unsigned_text(column, value, unsigned)
    if isinstance(value, NARROW_FLOAT_TYPES):
        return _narrow_float_text(column, value)
    return field_text(column, _plain_field_value(column, value), newlines=newlines)


def _unsigned_text(column: str, value: Any, unsigned: bool) -> str:
    if not unsigned:
        raise PointError(
            f"field {column!r} is an unsigned integer ({type(value).__name__}), which the "
            "InfluxDB 1.x write API cannot store: cast the column to a signed integer type, "
            "or write through the 2.x API (influx_api=v2), which takes it with the u suffix"
        )
    return f"{int(value)}u"


def _narrow_float_text(column: str, value: Any) -> str:
    if not np.isfinite(value):
        raise PointError(
            f"field {column!r} is {float_name(float(value))}; InfluxDB cannot store NaN or "
            "infinite floats"
        )
    text = str(value)
    return text[:-2] if text.endswith(".0") else text


def _string_text(column: str, value: str, newlines: bool) -> str:
    if "\x00" in value:
        raise PointError(
            f"field {column!r} contains a NUL character, which the PostgreSQL staging "
            "store cannot hold"
        )
    if not newlines and ("\n" in value or "\r" in value):
        raise PointError(newline_problem(column, value))
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
    return f'"{value.translate(ESCAPE_STRING)}"'


def newline_problem(column: str, value: str) -> str:
    """Why a string field value holding a raw line feed or carriage return is refused."""
    char = "a newline" if "\n" in value else "a carriage return"
    return (
        f"field {column!r} value {show(value)} contains {char}, where VictoriaMetrics and "
        "other readers of line protocol end the line, so that the rest of the value "
        "would be read as points of its own; set allow_newlines_in_strings=true only if "
        "every target is InfluxDB, which reads it inside the quotes"
    )


def _plain_field_value(column: str, value: Any) -> bool | int | float | str | None:
    """numpy scalars, Decimal and subclasses as plain bool/int/float/str; None if null."""
    if value is MISSING:
        raise PointError(f"the row has no field column {column!r}")
    if is_null(value):
        return None
    if isinstance(value, BOOL_TYPES):
        return bool(value)
    if isinstance(value, NUMPY_TIME_TYPES):  # numpy counts them as integers: not here
        raise PointError(
            f"field {column!r} has unsupported type {type(value).__name__} ({show(value)}); "
            "a field must be a bool, int, float, Decimal or str"
        )
    if isinstance(value, Decimal):
        return _decimal_float(column, value)
    if isinstance(value, INT_TYPES):
        return int(value)
    if isinstance(value, FLOAT_TYPES):
        return float(value)
    if isinstance(value, str):
        return str.__str__(value)
    raise PointError(
        f"field {column!r} has unsupported type {type(value).__name__} ({show(value)}); "
        "a field must be a bool, int, float, Decimal or str"
    )


def _decimal_float(column: str, value: Decimal) -> float:
    if not value.is_finite():
        raise PointError(f"field {column!r} is Decimal {value}; InfluxDB cannot store it")
    result = float(value)
    if math.isinf(result):
        raise PointError(f"field {column!r} value {value} is too large for a float")
    return result


def is_null(value: Any) -> bool:
    if value is None:
        return True
    kind = type(value)
    # pandas.NA / pandas.NaT, matched by name so pandas need not be imported.
    if kind.__name__ in ("NAType", "NaTType") and kind.__module__.startswith("pandas"):
        return True
    return isinstance(value, NUMPY_TIME_TYPES) and bool(np.isnat(value))


# --- small helpers --------------------------------------------------------------


def show(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def float_name(value: float) -> str:
    return "NaN" if math.isnan(value) else ("+infinity" if value > 0 else "-infinity")


# --- reading lines back -------------------------------------------------------

FieldValue = bool | int | float | str
Tags = tuple[tuple[str, str], ...]
_TRUE = frozenset({"t", "T", "true", "True", "TRUE"})
_FALSE = frozenset({"f", "F", "false", "False", "FALSE"})


@dataclass(frozen=True)
class ParsedPoint:
    measurement: str
    tags: Tags  # sorted by key, as InfluxDB keys a series
    fields: dict[str, FieldValue]
    time_ns: int | None


def _scan(line: str, pos: int, stops: str, escapable: str) -> tuple[str, int]:
    """Text from ``pos`` up to the first unescaped character of ``stops``.

    ``\\x`` for x in ``escapable`` stands for x; any other backslash is itself.
    """
    out: list[str] = []
    end = len(line)
    while pos < end:
        char = line[pos]
        if char == "\\" and pos + 1 < end and line[pos + 1] in escapable:
            out.append(line[pos + 1])
            pos += 2
            continue
        if char in stops:
            break
        out.append(char)
        pos += 1
    return "".join(out), pos


def _scan_string(line: str, pos: int) -> tuple[str, int]:
    """A quoted field value starting at the quote at ``pos``; returns it and the next pos."""
    out: list[str] = []
    pos += 1
    while pos < len(line):
        char = line[pos]
        if char == "\\" and pos + 1 < len(line) and line[pos + 1] in '"\\':
            out.append(line[pos + 1])
            pos += 2
            continue
        if char == '"':
            return "".join(out), pos + 1
        out.append(char)
        pos += 1
    raise LineProtocolError("unterminated string field value")


def _field_value(text: str) -> FieldValue:
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    try:
        if text[-1:] in ("i", "u"):
            return int(text[:-1])
        return float(text)
    except ValueError:
        raise LineProtocolError(f"bad field value {text!r}") from None


def _fields(line: str, pos: int) -> tuple[dict[str, FieldValue], int]:
    fields: dict[str, FieldValue] = {}
    while True:
        key, pos = _scan(line, pos, "=, ", "=, ")
        if pos >= len(line) or line[pos] != "=" or not key:
            raise LineProtocolError("a field needs a key=value")
        pos += 1
        if line[pos : pos + 1] == '"':
            value: FieldValue
            value, pos = _scan_string(line, pos)
            if line[pos : pos + 1] not in ("", ",", " "):
                raise LineProtocolError(f"text after the string value of field {key!r}")
        else:
            text, pos = _scan(line, pos, ", ", "")
            value = _field_value(text)
        fields[key] = value
        if pos >= len(line) or line[pos] == " ":
            return fields, pos
        pos += 1  # the comma before the next field


def parse_line(line: str) -> ParsedPoint:
    """One line of InfluxDB line protocol; raises LineProtocolError when it is not one.

    A line without a backslash or a double quote (the usual one) is read by splitting
    it (`_parse_plain`), several times faster than scanning it; anything that does not
    read plainly that way is scanned (`_parse_scanned`), which gives the same point or
    says what is wrong."""
    if "\\" not in line and '"' not in line:
        point = _parse_plain(line)
        if point is not None:
            return point
    return _parse_scanned(line)


def _parse_plain(line: str) -> ParsedPoint | None:
    """A line without escapes or string values, split at its spaces, commas and equals
    signs as the scanner would cut it; None for anything else (an empty name, a
    missing ``=``, a value that is not one), left to the scanner to say why."""
    parts = line.split(" ")
    if len(parts) not in (2, 3):
        return None
    series, field_text = parts[0].split(","), parts[1]
    if not series[0]:
        return None
    tags = []
    for pair in series[1:]:
        key, equals, value = pair.partition("=")
        if not equals:
            return None
        tags.append((key, value))
    fields: dict[str, FieldValue] = {}
    try:
        for pair in field_text.split(","):
            key, equals, value = pair.partition("=")
            if not key or not equals:
                return None
            fields[key] = _field_value(value)
        stamp = parts[2].strip() if len(parts) == 3 else ""
        time_ns = int(stamp) if stamp else None
    except (LineProtocolError, ValueError):
        return None
    return ParsedPoint(series[0], tuple(sorted(tags)), fields, time_ns)


def _parse_scanned(line: str) -> ParsedPoint:
    """One line read a character at a time (escapes, string values)."""
    measurement, pos = _scan(line, 0, ", ", ", ")
    if not measurement:
        raise LineProtocolError("no measurement")
    tags: list[tuple[str, str]] = []
    while pos < len(line) and line[pos] == ",":
        key, pos = _scan(line, pos + 1, "=, ", "=, ")
        if pos >= len(line) or line[pos] != "=":
            raise LineProtocolError(f"tag {key!r} has no value")
        value, pos = _scan(line, pos + 1, ", ", "=, ")
        tags.append((key, value))
    if pos >= len(line) or line[pos] != " ":
        raise LineProtocolError("no fields")
    fields, pos = _fields(line, pos + 1)
    stamp = line[pos:].strip()
    try:
        time_ns = int(stamp) if stamp else None
    except ValueError:
        raise LineProtocolError(f"bad timestamp {stamp!r}") from None
    return ParsedPoint(measurement, tuple(sorted(tags)), fields, time_ns)
