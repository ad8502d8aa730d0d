"""Reading a PostgreSQL target back for ``twophase verify``, a window at a time.

A measurement's window is read from its table through a server-side cursor, ordered
by tags then time, and handed out as series (one per tag set, a long one in pieces):
times in nanoseconds (the stored microseconds times 1,000), fields by column, empty
tags and null fields left as the Readback contract allows. Reads only: safe to repeat.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from twophase.errors import TargetNotFoundError
from twophase.postgresql import tables
from twophase.postgresql.connect import classify, connect, display_url, schema_of

if TYPE_CHECKING:
    from twophase.config import TargetConfig

__all__ = ["PostgresReadback", "ns_of"]

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_PIECE = 10_000  # values of a series handed out at a time
_FETCH = 2_000  # rows a server-side cursor brings per round trip


def ns_of(moment: datetime) -> int:
    """A timestamptz value as nanoseconds since the epoch (exact: microseconds * 1,000)."""
    return (moment - _EPOCH) // timedelta(microseconds=1) * 1000


def _moment(ns: int, *, up: bool) -> datetime:
    """The microsecond a ns bound falls in, rounded inward (``up`` for a start)."""
    micros = -(-ns // 1000) if up else ns // 1000
    return _EPOCH + timedelta(microseconds=micros)


class PostgresReadback:
    """Reads a PostgreSQL target's tables (see the module). One connection, opened on
    first use; not thread-safe (verify reads one window at a time)."""

    def __init__(self, config: TargetConfig) -> None:
        self._config = config
        self._schema = schema_of(config)
        self._conn: psycopg.Connection[Any] | None = None
        self._cursors = itertools.count()

    def probe(self) -> None:
        """Fail at once when the target cannot be read: unreachable, refused, or its
        schema missing (TargetNotFoundError naming it)."""
        try:
            with self._connection().transaction(), self._connection().cursor() as cur:
                cur.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (self._schema,))
                found = cur.fetchone() is not None
        except psycopg.Error as exc:
            raise classify(exc, self._config, in_transaction=False) from None
        if not found:
            raise TargetNotFoundError(
                f"PostgreSQL target {display_url(self._config)} has no schema "
                f"{self._schema!r} (target_schema)"
            )

    def window(self, measurement: str, start: int, end: int) -> Iterable[dict[str, Any]]:
        """The measurement's points with ``start <= time <= end`` (ns), as series; none
        when it has no table."""
        try:
            yield from self._window(measurement, start, end)
        except psycopg.Error as exc:
            raise classify(exc, self._config, in_transaction=False) from None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _window(self, measurement: str, start: int, end: int) -> Iterator[dict[str, Any]]:
        conn = self._connection()
        with conn.transaction(), conn.cursor() as cur:
            shape = tables.read_shape(cur, self._schema, measurement)
        if shape is None:
            return
        fields = [c for c in shape.columns if shape.is_field(c)]
        columns = [*shape.key, *fields]
        query = sql.SQL("SELECT {} FROM {} WHERE {} BETWEEN %s AND %s ORDER BY {}").format(
            sql.SQL(", ").join(sql.Identifier(c) for c in columns),
            sql.Identifier(shape.schema, shape.name),
            sql.Identifier(tables.TIME),
            sql.SQL(", ").join(sql.Identifier(c) for c in (*shape.tags, tables.TIME)),
        )
        name = f"twophase_readback_{next(self._cursors)}"  # windows may be read interleaved
        with conn.transaction(), conn.cursor(name=name) as cur:
            cur.itersize = _FETCH
            cur.execute(query, (_moment(start, up=True), _moment(end, up=False)))
            yield from _series(measurement, shape.tags, fields, cur)

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = connect(self._config)
        return self._conn


def _series(
    measurement: str, tags: tuple[str, ...], fields: list[str], rows: Iterable[tuple[Any, ...]]
) -> Iterator[dict[str, Any]]:
    """Rows ordered by tags then time as series, a piece per ``_PIECE`` values."""
    current: tuple[str, ...] | None = None
    values: list[list[Any]] = []
    width = len(tags)
    for row in rows:
        key = tuple(row[1 : 1 + width])
        if (key != current and values) or len(values) >= _PIECE:
            yield _one(measurement, tags, current or (), fields, values)
            values = []
        current = key
        values.append([ns_of(row[0]), *map(_plain, row[1 + width :])])
    if values:
        yield _one(measurement, tags, current or (), fields, values)


def _plain(value: Any) -> Any:
    """A numeric column's value as the integer (or float) line protocol wrote."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value


def _one(
    measurement: str,
    tags: tuple[str, ...],
    key: tuple[str, ...],
    fields: list[str],
    values: list[list[Any]],
) -> dict[str, Any]:
    return {
        "name": measurement,
        "tags": {tag: value for tag, value in zip(tags, key, strict=True) if value != ""},
        "columns": ["time", *fields],
        "values": values,
    }
