"""Time column values to nanoseconds since the epoch, for
[`twophase.points.builder`][twophase.points.builder].

Accepts ints, floats and Decimals in the spec's precision, ``datetime`` (naive
means UTC) and ``date``, pandas ``Timestamp``, numpy ``datetime64`` and
ISO-8601 / RFC 3339 text. The result is exact and may be outside InfluxDB's
time range; [`PointBuilder`][twophase.points.builder.PointBuilder] checks that.
"""

from __future__ import annotations

import math
import re
from datetime import date, datetime, timezone
from decimal import ROUND_HALF_EVEN, Decimal, DecimalException, localcontext
from typing import Any

from twophase.errors import PointError
from twophase.points.lineproto import (
    BOOL_TYPES,
    FLOAT_TYPES,
    INT_TYPES,
    MISSING,
    NUMPY_TIME_TYPES,
    is_null,
    show,
)

try:  # numpy's times come from pandas / Arrow conversions; without numpy there are none
    import numpy as np
except ImportError:  # pragma: no cover - numpy ships with the spark extra
    np = None  # type: ignore[assignment]

_NS_PER_DAY = 86_400 * 1_000_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_NAIVE_EPOCH = datetime(1970, 1, 1)
_EPOCH_DATE = date(1970, 1, 1)

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


def datetime_ns(value: datetime) -> int:
    """Exact nanoseconds since the epoch; a naive datetime is UTC."""
    if value.tzinfo is None:
        delta = value - _NAIVE_EPOCH
    elif value.utcoffset() is None:  # a tzinfo that knows no offset: naive too
        delta = value.replace(tzinfo=None) - _NAIVE_EPOCH
    else:
        delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000


def time_ns(column: str, value: Any, unit: int) -> int:
    """The time column's value in nanoseconds (may be out of range); raises PointError."""
    if value is MISSING:
        raise PointError(f"the row has no time column {column!r}")
    if is_null(value):
        raise PointError(f"time column {column!r} is null")
    try:
        stamp = _parse_time(value, unit)
    except (ValueError, OverflowError, DecimalException):
        stamp = None
    if stamp is None:
        kind = "" if isinstance(value, str) else f" ({type(value).__name__})"
        raise PointError(f"time column {column!r} cannot be parsed as a time: {show(value)}{kind}")
    return stamp


def _parse_time(value: Any, unit: int) -> int | None:
    """Nanoseconds, or None for a value that is not a time."""
    if isinstance(value, BOOL_TYPES + NUMPY_TIME_TYPES[1:]):
        return None  # booleans and durations are integers to Python/numpy, not times
    if isinstance(value, datetime):
        return _moment_ns(value)
    if isinstance(value, date):
        return (value - _EPOCH_DATE).days * _NS_PER_DAY
    if isinstance(value, str):
        return _iso_ns(value)
    if isinstance(value, NUMPY_TIME_TYPES[:1]):
        return _numpy_time_ns(value)
    return _number_ns(value, unit)


def _moment_ns(value: datetime) -> int | None:
    nanos = getattr(value, "asm8", None)  # pandas Timestamp: keeps its nanoseconds
    if nanos is not None:
        return _numpy_time_ns(nanos)
    return datetime_ns(value)


def _number_ns(value: Any, unit: int) -> int | None:
    """A number of ``unit`` in nanoseconds, or None for anything else."""
    if isinstance(value, INT_TYPES):
        return int(value) * unit
    if isinstance(value, FLOAT_TYPES):
        number = float(value)
        if not math.isfinite(number):
            return None
        # repr: the number as written, not its binary neighbour
        return _decimal_ns(Decimal(repr(number)), unit)
    if isinstance(value, Decimal):
        return _decimal_ns(value, unit)
    return None


def _decimal_ns(value: Decimal, unit: int) -> int | None:
    """Exact, rounded half to even; None for NaN and infinities."""
    if not value.is_finite():
        return None
    with localcontext() as context:
        context.prec = 60  # exact for any in-range time
        return int((value * unit).to_integral_value(rounding=ROUND_HALF_EVEN))


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
    stamp = datetime_ns(moment) + (int(fraction.ljust(9, "0")) if fraction else 0)
    sign, offset_hours, offset_minutes = match.group(9, 10, 11)
    if sign is None:  # "Z" or no offset: UTC
        return stamp
    hours, minutes = int(offset_hours), int(offset_minutes or 0)
    if hours > 23 or minutes > 59:
        return None
    offset_ns = (hours * 3_600 + minutes * 60) * 1_000_000_000
    return stamp - offset_ns if sign == "+" else stamp + offset_ns
