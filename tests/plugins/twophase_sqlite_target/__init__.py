"""A kind of twophase target that keeps points in a SQLite file: ``sqlite:///path/to.db``.

A complete kind in one module, registered only through its package's entry point
(``[twophase.targets] sqlite = twophase_sqlite_target:KIND``). A point is keyed by
its measurement, tag set and time, and a point written again overwrites itself, its
fields merged, as InfluxDB does: a re-sent body changes nothing (``OVERWRITE``). The
first type stored for a field is its type; a point with another type for it is
refused, and the request with it (nothing of it is written), naming the line: the
sender then sends the other lines again without it.
"""

from __future__ import annotations

import contextlib
import gzip
import itertools
import json
import sqlite3
from collections.abc import Iterable, Iterator
from typing import Any, NoReturn
from urllib.parse import quote, urlsplit

from twophase.config import InfluxConfig, env_name
from twophase.errors import (
    BadPointsError,
    ConfigError,
    LineProtocolError,
    TargetNotFoundError,
    TargetRequestError,
    TransientWriteError,
)
from twophase.points.lineproto import parse_line
from twophase.targets import OVERWRITE, TargetKind

__all__ = ["KIND", "SqliteReadback", "SqliteWriter"]

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS points (measurement TEXT NOT NULL, tags TEXT NOT NULL,"
    " time INTEGER NOT NULL, fields TEXT NOT NULL, PRIMARY KEY (measurement, tags, time))",
    "CREATE TABLE IF NOT EXISTS field_types (measurement TEXT NOT NULL, field TEXT NOT NULL,"
    " type TEXT NOT NULL, PRIMARY KEY (measurement, field))",
)
# A point written again has its fields merged into the stored ones (InfluxDB's overwrite).
_UPSERT = (
    "INSERT INTO points VALUES (?, ?, ?, ?) ON CONFLICT (measurement, tags, time)"
    " DO UPDATE SET fields = json_patch(points.fields, excluded.fields)"
)


def _path(config: InfluxConfig) -> str:
    return urlsplit(config.url).path


def _check(config: InfluxConfig) -> None:
    if not _path(config):
        raise ConfigError(
            env_name("target_url"), "a sqlite:// URL names a file: sqlite:///path/to.db"
        )


@contextlib.contextmanager
def _connected(config: InfluxConfig, read_only: bool = False) -> Iterator[sqlite3.Connection]:
    """A connection of its own for each call (a writer's lanes write at once), its
    failures classified: a locked file may free up, a file that cannot be opened will
    not. Secrets: a SQLite URL holds none."""
    path = _path(config)
    uri = f"file:{quote(path)}" + ("?mode=ro" if read_only else "")
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=config.timeout_s, isolation_level=None)
    except sqlite3.Error as exc:
        raise TargetNotFoundError(f"SQLite target {path}: {exc}") from None
    try:
        yield conn
    except sqlite3.Error as exc:
        raise _classified(path, exc) from None
    finally:
        conn.close()


def _classified(path: str, exc: sqlite3.Error) -> Exception:
    problem = str(exc)
    if "locked" in problem or "busy" in problem:
        return TransientWriteError(f"SQLite target {path}: {problem}")
    if "unable to open" in problem:
        return TargetNotFoundError(f"SQLite target {path}: {problem}")
    return TargetRequestError(f"SQLite target {path}: {problem}")


def _type(value: object) -> str:
    if isinstance(value, bool):  # before int: a bool is an int in Python
        return "boolean"
    return {int: "integer", float: "float", str: "string"}[type(value)]


class SqliteWriter:
    """One request a call: its points in one transaction, all or nothing."""

    def __init__(self, config: InfluxConfig) -> None:
        self._config = config

    def write(self, body: bytes, gzipped: bool = False) -> None:
        text = (gzip.decompress(body) if gzipped else body).decode("utf-8")
        lines = [line for line in text.split("\n") if line.strip()]
        with _connected(self._config) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in _SCHEMA:
                    conn.execute(statement)
                for number, line in enumerate(lines):
                    self._store(conn, number, line)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def _store(self, conn: sqlite3.Connection, number: int, line: str) -> None:
        try:
            point = parse_line(line)
        except LineProtocolError as exc:
            _refuse(number, line, f"unable to parse: {exc}")
        for field, value in point.fields.items():
            kind = _type(value)
            stored = conn.execute(
                "INSERT INTO field_types VALUES (?, ?, ?) ON CONFLICT DO UPDATE SET type = type"
                " RETURNING type",
                (point.measurement, field, kind),
            ).fetchone()[0]
            if stored != kind:
                _refuse(
                    number,
                    line,
                    f'field type conflict: field "{field}" on measurement '
                    f'"{point.measurement}" is type {kind}, already exists as type {stored}',
                )
        tags = json.dumps(point.tags)
        conn.execute(_UPSERT, (point.measurement, tags, point.time_ns, json.dumps(point.fields)))

    def close(self) -> None:
        """Nothing held between calls."""


def _refuse(number: int, line: str, reason: str) -> NoReturn:
    raise BadPointsError(f"SQLite target refused line {number + 1}: {reason}", reason, number, line)


class SqliteReadback:
    """Windows of a measurement, a series (a tag set) at a time."""

    def __init__(self, config: InfluxConfig) -> None:
        self._config = config

    def window(self, measurement: str, start: int, end: int) -> Iterable[dict[str, Any]]:
        with _connected(self._config, read_only=True) as conn:
            if not _has_points(conn):
                return []
            rows = conn.execute(
                "SELECT tags, time, fields FROM points WHERE measurement = ?"
                " AND time BETWEEN ? AND ? ORDER BY tags, time",
                (measurement, start, end),
            ).fetchall()
        return [
            _series(measurement, tags, list(group))
            for tags, group in itertools.groupby(rows, key=lambda row: row[0])
        ]

    def probe(self) -> None:
        with _connected(self._config, read_only=True) as conn:
            _has_points(conn)

    def close(self) -> None:
        """Nothing held between calls."""


def _has_points(conn: sqlite3.Connection) -> bool:
    found = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'points'").fetchone()
    return found is not None


def _series(measurement: str, tags: str, rows: list[tuple[str, int, str]]) -> dict[str, Any]:
    points = [(time, json.loads(fields)) for _, time, fields in rows]
    names = sorted({name for _, fields in points for name in fields})
    return {
        "name": measurement,
        "tags": dict(json.loads(tags)),
        "columns": ["time", *names],
        "values": [[time, *(fields.get(n) for n in names)] for time, fields in points],
    }


KIND = TargetKind(
    name="sqlite",
    schemes=("sqlite",),
    resend=OVERWRITE,
    writer=SqliteWriter,
    readback=SqliteReadback,
    check=_check,
)
