"""A body loaded without reading its points in Python: one regular expression turns its
lines into ``COPY`` rows, and PostgreSQL parses the values.

Line protocol written by the sink's encoder is regular: a body's lines are one
measurement with the same tag and field keys in the same order, and the escapes line
protocol has for tag values (``\\,``, ``\\=``, ``\\ ``) and string values (``\\"``,
``\\\\``) are read by COPY text as they are by the point reader. Such a body (the whole
body, or nothing of it) is matched by one pattern built from its first line and its
table's shape, and its values taken out by ``findall`` into ``COPY`` text (its tags, its
fields, its time in nanoseconds, tab-separated), so no Python runs per point. The rows
go into a temporary table, then into the measurement's table with the same ``INSERT ...
ON CONFLICT`` as a body read point by point, in the caller's savepoint.

The pattern takes only what the point-by-point reading gives the same row for: a float
field into a ``double precision`` column, an integer into a ``bigint`` one, a boolean
into a ``boolean`` one, a string into a ``text`` one, and tag and string values without
a tab, a line end, a NUL or a backslash that escapes nothing. Anything else (another
shape, a line that does not match, a value PostgreSQL refuses, a point written twice in
the body) is not an error here: the caller rolls back to its savepoint and reads the
body point by point, which writes or refuses it as it always did. See ``plan``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from twophase.errors import LineProtocolError
from twophase.points.lineproto import parse_line
from twophase.postgresql import tables
from twophase.postgresql.tables import TableShape

__all__ = ["Plan", "first_keys", "load", "plan", "rows"]

_SCRATCH = sql.Identifier("pg_temp", "twophase_streamed")
_NS = "twophase_ns"  # the scratch table's time column, in nanoseconds
_REST = "twophase_rest"  # the nanoseconds past its whole second, in the upsert
_OWN = frozenset({tables.TIME, _NS, _REST})
# Exactly what ``float()`` and PostgreSQL's float8 input read alike (both round
# correctly); no ``inf``/``nan``/underscores, which only one of them takes.
_FLOAT = r"(-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)"
_INT = r"(-?[0-9]+)[iu]"
_BOOL = r"(t|T|true|True|TRUE|f|F|false|False|FALSE)"
# A string value: COPY text reads ``\"`` as ``"`` and ``\\`` as ``\``, as line protocol
# does; any other backslash, and a tab, line end or NUL, is left to the point reader.
_STRING = r'"((?:[^"\\\t\r\n\x00]|\\["\\])*)"'
_VALUES = {"double precision": _FLOAT, "bigint": _INT, "boolean": _BOOL, "text": _STRING}
# A tag value: COPY text reads ``\,``, ``\=`` and ``\ `` as the character escaped, as
# line protocol does; an unescaped ``=`` and any other backslash are left to the reader.
_TAG = r"((?:[^,= \t\r\n\\\x00]|\\[,= ])*)"
_TIME = r"(-?[0-9]{1,19})"
_SPECIAL = ("\r", "\t", "\x00")
# A measurement or key the pattern names as it is: nothing that line protocol escapes.
_PLAIN_NAME = re.compile(r'[^,= \\"\t\r\n\x00]+')


@dataclass(frozen=True)
class Plan:
    """How a body of one shape becomes ``COPY`` rows: its pattern (a group a value, in
    the line's order), the tag and field columns in that order, and the table."""

    pattern: re.Pattern[str]
    tags: tuple[str, ...]
    fields: tuple[str, ...]
    shape: TableShape


def first_keys(text: str) -> tuple[str, tuple[str, ...], tuple[str, ...]] | None:
    """The measurement, tag keys and field keys of the body's first line, in the line's
    order, as the point reader reads them; None when the body cannot be loaded
    streamed at all (a character COPY text would read otherwise, a first line that is
    not a point, a name that line protocol escapes)."""
    if any(char in text for char in _SPECIAL):
        return None
    first = text.partition("\n")[0]
    try:
        point = parse_line(first)
    except LineProtocolError:
        return None
    names = (point.measurement, *(key for key, _ in point.tags), *point.fields)
    if not all(_PLAIN_NAME.fullmatch(name) for name in names):
        return None
    # The reader sorts the tags; the pattern needs them where the line has them (a tag
    # value holds no unescaped comma, so ",key=" first stands where the tag does).
    tags = sorted((key for key, _ in point.tags), key=lambda key: first.find(f",{key}="))
    return point.measurement, tuple(tags), tuple(point.fields)


def plan(keys: tuple[str, tuple[str, ...], tuple[str, ...]], shape: TableShape) -> Plan | None:
    """The plan for lines of these keys into the table of ``shape``, or None when one
    of them would be read differently, or refused, point by point: a tag without its
    column in the key, a field without a column of a type streamed, a name used twice."""
    measurement, tags, fields = keys
    names = set(tags) | set(fields)
    if len(names) != len(tags) + len(fields) or names & _OWN or not fields:
        return None
    if any(tag not in shape.tags for tag in tags):
        return None
    kinds = [_VALUES.get(shape.columns.get(name, "")) for name in fields]
    if any(
        kind is None or not shape.is_field(name) for kind, name in zip(kinds, fields, strict=True)
    ):
        return None
    head = re.escape(measurement) + "".join(f",{re.escape(tag)}={_TAG}" for tag in tags)
    body = ",".join(f"{re.escape(name)}={kind}" for name, kind in zip(fields, kinds, strict=True))
    pattern = re.compile(f"^{head} {body} {_TIME}$", re.MULTILINE)
    return Plan(pattern, tags, fields, shape)


def rows(text: str, how: Plan) -> str | None:
    """The body's ``COPY`` text (each line's tags, fields and time, in the line's order),
    or None when a line does not match the plan. ``findall`` and ``join`` run no Python
    per line (a replacement template would, to expand it)."""
    lines = text.count("\n") + (0 if text.endswith("\n") else 1)
    found = how.pattern.findall(text)  # each line matched at most once: anchored to it
    if len(found) != lines or not lines:
        return None
    return "\n".join(map("\t".join, found)) + "\n"


def load(cur: psycopg.Cursor[Any], how: Plan, copied: str) -> None:
    """The rows into their table, in the caller's transaction: ``COPY`` into a
    temporary table (its time in nanoseconds), then one ``INSERT ... ON CONFLICT``
    that sets the fields the lines have, their time made a ``timestamptz`` to the
    microsecond (rounded down, as a point read in Python is)."""
    shape = how.shape
    scratch = [sql.SQL("{} bigint").format(sql.Identifier(_NS))]
    scratch += [sql.SQL("{} text").format(sql.Identifier(tag)) for tag in how.tags]
    scratch += [
        sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(shape.columns[name]))
        for name in how.fields
    ]
    cur.execute(
        sql.SQL("CREATE TEMP TABLE {} ({}) ON COMMIT DROP").format(
            _SCRATCH, sql.SQL(", ").join(scratch)
        )
    )
    order = sql.SQL(", ").join(sql.Identifier(c) for c in (*how.tags, *how.fields, _NS))
    with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(_SCRATCH, order)) as copy:
        copy.write(copied)
    cur.execute(_upsert(how))
    cur.execute(sql.SQL("DROP TABLE {}").format(_SCRATCH))


def _upsert(how: Plan) -> sql.Composed:
    shape = how.shape
    columns = [tables.TIME, *shape.tags, *how.fields]
    given = set(how.tags)
    # floor(ns / 1000) µs as whole seconds (rounded down) plus the µs left: each exact in a
    # float8, and nothing that overflows a bigint.
    values: list[sql.Composable] = [
        sql.SQL(
            "to_timestamp({0} / 1000000000 - ({0} % 1000000000 < 0)::int)"
            " + ({1} / 1000) * interval '1 microsecond'"
        ).format(sql.Identifier(_NS), sql.Identifier(_REST))
    ]
    values += [sql.Identifier(tag) if tag in given else sql.Literal("") for tag in shape.tags]
    values += [sql.Identifier(name) for name in how.fields]
    updates = sql.SQL(", ").join(
        sql.SQL("{0} = COALESCE(EXCLUDED.{0}, old.{0})").format(sql.Identifier(f))
        for f in how.fields
    )
    return sql.SQL(
        "INSERT INTO {} AS old ({}) SELECT {} FROM (SELECT *, (({} % 1000000000) + 1000000000)"
        " % 1000000000 AS {} FROM {}) s ON CONFLICT ({}) DO UPDATE SET {}"
    ).format(
        sql.Identifier(shape.schema, shape.name),
        sql.SQL(", ").join(sql.Identifier(c) for c in columns),
        sql.SQL(", ").join(values),
        sql.Identifier(_NS),
        sql.Identifier(_REST),
        _SCRATCH,
        sql.SQL(", ").join(sql.Identifier(c) for c in shape.key),
        updates,
    )
