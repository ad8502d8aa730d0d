"""A measurement's table on a PostgreSQL target: its shape, read, checked or created.

A measurement ``m`` is the table ``<target_schema>.m``: a column ``time timestamptz NOT
NULL``; one ``text NOT NULL DEFAULT ''`` column per tag (an absent tag is ``''``, as
InfluxDB treats an empty tag); one typed column per field (float: ``double precision``,
integer: ``bigint``, boolean: ``boolean``, string: ``text``); and a UNIQUE key on
``(time, tags...)``, so that a point written again replaces its row
(``INSERT ... ON CONFLICT (time, tags...) DO UPDATE``: last write wins, field by field,
as in InfluxDB). The key includes the time column, so a TimescaleDB hypertable
partitioned on ``time`` takes the same SQL unchanged.

Line protocol does not tell an unsigned integer from a signed one once read: both are
integers, written to ``bigint`` within its range (a ``numeric(20,0)`` column, made by
hand, takes the whole unsigned range).

A tag column made by hand may be ``text`` or ``varchar``, never ``character(n)``: that
type pads its values with spaces and ignores trailing ones when it compares them, so
two tags would be one key.

With ``target_create_tables`` a missing table is created from the first points seen
(their tags and fields), and a field column missing later is added
(``ALTER TABLE ... ADD COLUMN``), each outside any epoch's transaction
([`twophase.postgresql.ddl`][twophase.postgresql.ddl]); a tag the table lacks refuses
that point, since the unique key cannot change under live data. Without it the table
must exist with the shape above (``TargetTableError`` naming the table and the column
otherwise), and a point whose field has no column, or whose value the column cannot
hold, is refused with the reason. DDL is taken under a transaction-level advisory lock
on the table's name, so two writers creating the same table do not collide; it is
idempotent (``IF NOT EXISTS``).
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from twophase.errors import TargetTableError
from twophase.points.lineproto import FieldValue, ParsedPoint

__all__ = [
    "TIME",
    "TableShape",
    "add_fields",
    "check_shape",
    "column_type",
    "create_table",
    "lock_table_name",
    "point_problem",
    "read_shape",
    "shown",
    "value_problem",
]

TIME = "time"
TIMESTAMPTZ = "timestamp with time zone"
MAX_IDENTIFIER_BYTES = 63  # PostgreSQL cuts longer names (NAMEDATALEN - 1): two would collide
TEXT_TYPES = ("text", "character varying", "character")
_INT_RANGES = {
    "bigint": (-(2**63), 2**63 - 1),
    "integer": (-(2**31), 2**31 - 1),
    "smallint": (-(2**15), 2**15 - 1),
}
_FLOAT_TYPES = ("double precision", "real")
_NUMERIC = re.compile(r"numeric(?:\((\d+)(?:,(\d+))?\))?")
_LOCK_SPACE = "twophase.postgresql.table"  # advisory lock keys of table DDL


def shown(*parts: str) -> str:
    """A name for messages (a table's: its schema and its own), as SQL would quote it."""
    return ".".join('"' + part.replace('"', '""') + '"' for part in parts)


@dataclass(frozen=True)
class TableShape:
    """What the writer needs of a table: its columns with their types (as PostgreSQL's
    ``format_type`` spells them), and its tag columns (the unique key's, ``time``
    aside, in key order)."""

    schema: str
    name: str
    columns: Mapping[str, str] = field(default_factory=dict)
    tags: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return shown(self.schema, self.name)

    @property
    def key(self) -> tuple[str, ...]:
        return (TIME, *self.tags)

    def is_field(self, column: str) -> bool:
        return column in self.columns and column not in self.key


def column_type(value: FieldValue) -> str:
    """The column type a field is created with, from its first value."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "bigint"
    if isinstance(value, float):
        return "double precision"
    return "text"


def value_problem(column: str, kind: str, value: FieldValue) -> str | None:
    """Why a column of type ``kind`` cannot hold the field's ``value``, or None."""
    if kind == "boolean":
        return None if isinstance(value, bool) else _mismatch(column, kind, value)
    if kind in TEXT_TYPES or kind.startswith(("character varying(", "character(")):
        if not isinstance(value, str):
            return _mismatch(column, kind, value)
        return (
            f"field {column!r}: PostgreSQL text cannot hold a NUL character"
            if "\0" in value
            else None
        )
    if isinstance(value, bool | str):
        return _mismatch(column, kind, value)
    return _number_problem(column, kind, value)


def _number_problem(column: str, kind: str, value: int | float) -> str | None:
    if kind in _INT_RANGES:
        low, high = _INT_RANGES[kind]
        if not isinstance(value, int):
            return _mismatch(column, kind, value)
        return (
            None if low <= value <= high else f"field {column!r}: {value} is out of {kind}'s range"
        )
    if kind in _FLOAT_TYPES:
        return None
    match = _NUMERIC.fullmatch(kind)
    if match is None:
        return f"field {column!r}: its column's type {kind} is not one twophase writes"
    if isinstance(value, float) and not math.isfinite(value):
        return f"field {column!r}: {value} has no {kind} value"
    precision, scale = match.group(1), match.group(2)
    if precision is not None and abs(value) >= 10 ** (int(precision) - int(scale or 0)):
        return f"field {column!r}: {value} is out of {kind}'s range"
    return None


def _mismatch(column: str, kind: str, value: FieldValue) -> str:
    return f"field {column!r} is a {_type_word(value)}, its column is {kind}"


def _type_word(value: FieldValue) -> str:
    if isinstance(value, bool):
        return "boolean"
    return {int: "integer", float: "float", str: "string"}[type(value)]


def name_problem(what: str, name: str) -> str | None:
    """Why ``name`` cannot name a table or column, or None."""
    if "\0" in name:
        return f"{what} {name!r} holds a NUL character, which no PostgreSQL name can"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_IDENTIFIER_BYTES:
        return (
            f"{what} {name!r} is longer than PostgreSQL's {MAX_IDENTIFIER_BYTES} bytes for a "
            "name (it would be cut, and could meet another)"
        )
    return None


def point_problem(point: ParsedPoint, shape: TableShape) -> str | None:
    """Why ``point`` cannot be written to its table as it is, or None."""
    if point.time_ns is None:
        return "the point has no timestamp (a target's rows are keyed on their time)"
    for key, _ in point.tags:
        problem = _tag_problem(key, shape)
        if problem:
            return problem
    for key, value in point.fields.items():
        problem = _field_problem(key, value, point, shape)
        if problem:
            return problem
    return None


def _tag_problem(key: str, shape: TableShape) -> str | None:
    if key == TIME:
        return "a tag named 'time' would be the table's time column"
    if key not in shape.tags:
        return (
            f"tag {key!r} has no column in the unique key of {shape.label} (on "
            f"{', '.join(shape.key)}): a tag must be a text column of that key, which "
            "cannot change under live data"
        )
    return None


def _field_problem(
    key: str, value: FieldValue, point: ParsedPoint, shape: TableShape
) -> str | None:
    if key == TIME or key in shape.tags or key in dict(point.tags):
        return f"field {key!r} has the name of the table's time or of a tag column"
    kind = shape.columns.get(key)
    if kind is None:
        return (
            f"field {key!r} has no column in {shape.label} (add it, or set "
            "target_create_tables to have twophase add it)"
        )
    return value_problem(key, kind, value)


def names_problem(point: ParsedPoint) -> str | None:
    """Why a point's measurement, tag or field names cannot name PostgreSQL objects."""
    return _names_problem(
        point.measurement, tuple(key for key, _ in point.tags), tuple(point.fields)
    )


@functools.lru_cache(maxsize=4096)
def _names_problem(measurement: str, tags: tuple[str, ...], fields: tuple[str, ...]) -> str | None:
    """The names of a point's shape checked once: a sink's points have a few shapes."""
    named = [("measurement", measurement)]
    named += [("tag", key) for key in tags] + [("field", key) for key in fields]
    return next((p for what, name in named if (p := name_problem(what, name))), None)


# --- the catalog --------------------------------------------------------------

_TABLE = """
SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')
"""
_COLUMNS = """
SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum
"""
# Unique keys usable as ON CONFLICT's arbiter: plain columns, whole table, valid.
_KEYS = """
SELECT array(
    SELECT a.attname FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
    JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum ORDER BY k.ord)
FROM pg_index i
WHERE i.indrelid = %s AND i.indisunique AND i.indisvalid
  AND i.indpred IS NULL AND i.indexprs IS NULL
ORDER BY i.indnatts DESC, i.indexrelid
"""


def read_shape(cur: psycopg.Cursor[Any], schema: str, table: str) -> TableShape | None:
    """The table's shape, checked (``check_shape``); None when there is no such table."""
    cur.execute(_TABLE, (schema, table))
    found = cur.fetchone()
    if found is None:
        return None
    oid = found[0]
    cur.execute(_COLUMNS, (oid,))
    columns = {str(name): str(kind) for name, kind in cur.fetchall()}
    cur.execute(_KEYS, (oid,))
    keys = [tuple(row[0]) for row in cur.fetchall()]
    return check_shape(schema, table, columns, keys)


def check_shape(
    schema: str, table: str, columns: Mapping[str, str], keys: Iterable[tuple[str, ...]]
) -> TableShape:
    """The shape of a table with ``columns`` and unique ``keys``; TargetTableError
    naming the table and the column when a sink cannot write to it: no ``time``
    column of type timestamptz, no unique key on ``time`` and text columns, or a tag
    column of that key that is ``character(n)``."""
    label = shown(schema, table)
    kind = columns.get(TIME)
    if kind is None:
        raise TargetTableError(label, f"the table has no column {TIME!r} (timestamptz NOT NULL)")
    if kind != TIMESTAMPTZ:
        raise TargetTableError(
            label,
            f"column {TIME!r} is {kind}: it must be timestamptz (timestamp with time zone), "
            "which keeps the instant whatever the session's time zone",
        )
    with_time = [key for key in keys if TIME in key]
    for key in with_time:
        others = [column for column in key if column != TIME]
        if all(_is_text(columns[column]) or _pads(columns[column]) for column in others):
            _check_unpadded(label, columns, others)
            return TableShape(schema, table, dict(columns), tuple(others))
    if with_time:
        column = next(c for c in with_time[0] if c != TIME and not _is_text(columns[c]))
        raise TargetTableError(
            label,
            f"column {column!r} is in its unique key on ({', '.join(with_time[0])}) but is "
            f"{columns[column]}: tag columns are text",
        )
    raise TargetTableError(
        label,
        f"the table has no unique key on ({TIME}, tag columns...): a point written again must "
        f"replace its row (ALTER TABLE {label} ADD UNIQUE ({TIME}, <tags>))",
    )


def _check_unpadded(label: str, columns: Mapping[str, str], tags: Iterable[str]) -> None:
    """Refuse a ``character(n)`` tag column: it pads its values with spaces and compares
    them without the trailing ones, so two tags that differ only there would be one
    key, and an upsert holding both would fail every time it is sent."""
    for tag in tags:
        if _pads(columns[tag]):
            raise TargetTableError(
                label,
                f"tag column {tag!r} is {columns[tag]}, which pads its values with spaces and "
                "ignores trailing ones when it compares them (two tags would be one row): "
                f"make it text or varchar (ALTER TABLE {label} ALTER COLUMN "
                f"{shown(tag)} TYPE text)",
            )


def _is_text(kind: str) -> bool:
    """A type a tag column may have: text, or varchar with or without a length."""
    return kind in ("text", "character varying") or kind.startswith("character varying(")


def _pads(kind: str) -> bool:
    """``character(n)`` (``bpchar``), as ``format_type`` spells it."""
    return kind == "bpchar" or kind.startswith("character(")


def lock_table_name(cur: psycopg.Cursor[Any], schema: str, table: str) -> None:
    """Take the transaction-level advisory lock that orders DDL on this table's name (a
    hash of it: two names may share a lock, which only orders them)."""
    cur.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
        (json.dumps([_LOCK_SPACE, schema, table]),),
    )


def create_table(
    cur: psycopg.Cursor[Any],
    schema: str,
    table: str,
    tags: Iterable[str],
    fields: Mapping[str, str],
) -> None:
    """``CREATE TABLE IF NOT EXISTS``: time, the tags (text, '' when absent), the typed
    fields and the unique key on (time, tags). Idempotent."""
    tag_list = list(tags)
    columns = [sql.SQL("{} timestamptz NOT NULL").format(sql.Identifier(TIME))]
    columns += [sql.SQL("{} text NOT NULL DEFAULT ''").format(sql.Identifier(t)) for t in tag_list]
    columns += [
        sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(kind))
        for name, kind in fields.items()
    ]
    key = sql.SQL(", ").join(sql.Identifier(c) for c in (TIME, *tag_list))
    columns.append(sql.SQL("UNIQUE ({})").format(key))
    cur.execute(
        sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
            sql.Identifier(schema, table), sql.SQL(", ").join(columns)
        )
    )


def add_fields(cur: psycopg.Cursor[Any], shape: TableShape, fields: Mapping[str, str]) -> None:
    """``ALTER TABLE ... ADD COLUMN IF NOT EXISTS`` for each field. Idempotent."""
    adds = [
        sql.SQL("ADD COLUMN IF NOT EXISTS {} {}").format(sql.Identifier(name), sql.SQL(kind))
        for name, kind in fields.items()
    ]
    if adds:
        cur.execute(
            sql.SQL("ALTER TABLE {} {}").format(
                sql.Identifier(shape.schema, shape.name), sql.SQL(", ").join(adds)
            )
        )
