"""An example kind of target, complete: points in a SQLite file, ``sqlite:///path/to.db``
and, transactional, ``sqlitetx:///path/to.db``.

The example of the guide to writing a kind of target
(``docs/targets/write-your-own.md``): a package of its own, ``twophase-sqlite-target``,
that registers both kinds through its entry points (``pyproject.toml`` beside this file:
``[twophase.targets] sqlite = "twophase_sqlite_target:KIND"``, ``sqlitetx = ...:TX_KIND``).
``pip install ./examples/sqlite-target`` installs it beside twophase; twophase itself
registers neither kind.

A point is keyed by its measurement, tag set and time, and a point written again
overwrites itself, its fields merged, as InfluxDB does: a re-sent body changes nothing
(``OVERWRITE``). The first type stored for a field is its type; a point with another
type for it is refused, and the request with it (nothing of it is written), naming the
line: the sender then sends the other lines again without it.

``sqlitetx`` (``TRANSACTION``) writes each epoch in one SQLite transaction with its
row in a ``delivered`` table, keyed on the sink, the target, the generation ``begin``
is given and the epoch: a record of another generation (from before a reset) never
skips an epoch.
"""

from __future__ import annotations

import contextlib
import gzip
import itertools
import json
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from typing import Any, NoReturn
from urllib.parse import quote, urlsplit

from twophase.config import TargetConfig, env_name
from twophase.errors import (
    BadPointsError,
    ConfigError,
    LineProtocolError,
    TargetNotFoundError,
    TargetRequestError,
    TransactionLostError,
    TransientWriteError,
    UsageError,
)
from twophase.points.lineproto import parse_line
from twophase.targets import OVERWRITE, TRANSACTION, TargetKind

__all__ = ["KIND", "TX_KIND", "SqliteEpochWriter", "SqliteReadback", "SqliteWriter"]

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


def _path(config: TargetConfig) -> str:
    return urlsplit(config.url).path


def _check(config: TargetConfig) -> None:
    if not _path(config):
        raise ConfigError(
            env_name("target_url"), "a sqlite:// URL names a file: sqlite:///path/to.db"
        )


@contextlib.contextmanager
def _connected(config: TargetConfig, read_only: bool = False) -> Iterator[sqlite3.Connection]:
    """A connection of its own for each call (a writer's lanes write at once), its
    failures classified: a locked file may free up, a file that cannot be opened will
    not. Secrets: a SQLite URL holds none."""
    path = _path(config)
    conn = _connect(config, read_only)
    try:
        yield conn
    except sqlite3.Error as exc:
        raise _classified(path, exc) from None
    finally:
        conn.close()


def _connect(config: TargetConfig, read_only: bool = False) -> sqlite3.Connection:
    path = _path(config)
    uri = f"file:{quote(path)}" + ("?mode=ro" if read_only else "")
    try:
        return sqlite3.connect(
            uri, uri=True, timeout=config.timeout_s, isolation_level=None, check_same_thread=False
        )
    except sqlite3.Error as exc:
        raise TargetNotFoundError(f"SQLite target {path}: {exc}") from None


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

    def __init__(self, config: TargetConfig) -> None:
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

    def __init__(self, config: TargetConfig) -> None:
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


_DELIVERED = (
    "CREATE TABLE IF NOT EXISTS delivered (sink_id TEXT NOT NULL, target TEXT NOT NULL,"
    " generation INTEGER NOT NULL, epoch INTEGER NOT NULL, delivered INTEGER NOT NULL,"
    " rejected INTEGER NOT NULL, PRIMARY KEY (sink_id, target, generation, epoch))"
)


class SqliteEpochWriter(SqliteWriter):
    """An epoch in one SQLite transaction, committed with its ``delivered`` row; a body
    outside an epoch in a transaction of its own (as ``SqliteWriter``). One epoch at a
    time: ``begin`` waits while another is open."""

    def __init__(self, config: TargetConfig) -> None:
        super().__init__(config)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._open: tuple[str, str, int, int] | None = None  # sink, target, generation, epoch

    def begin(
        self, sink_id: str, epoch: int, target: str, again: bool = False, *, generation: int = 0
    ) -> tuple[int, int] | None:
        if self._open is not None:
            raise UsageError("an epoch is open on this writer already: commit or roll it back")
        self._lock.acquire()
        key = (sink_id, target, generation, epoch)
        try:
            conn = self._conn = _connect(self._config)
            conn.execute("BEGIN IMMEDIATE")
            for statement in (*_SCHEMA, _DELIVERED):
                conn.execute(statement)
            found = conn.execute(
                "SELECT delivered, rejected FROM delivered WHERE sink_id = ? AND target = ?"
                " AND generation = ? AND epoch = ?",
                key,
            ).fetchone()
        except sqlite3.Error as exc:
            self._end()
            raise _classified(_path(self._config), exc) from None
        except BaseException:
            self._end()
            raise
        if found is not None and not again:
            self._end()
            return int(found[0]), int(found[1])
        self._open = key
        return None

    def write(self, body: bytes, gzipped: bool = False) -> None:
        if self._open is None:
            super().write(body, gzipped)
            return
        assert self._conn is not None
        text = (gzip.decompress(body) if gzipped else body).decode("utf-8")
        lines = [line for line in text.split("\n") if line.strip()]
        try:
            self._conn.execute("SAVEPOINT body")
            try:
                for number, line in enumerate(lines):
                    self._store(self._conn, number, line)
            except BadPointsError:
                self._conn.execute("ROLLBACK TO body")
                raise
            finally:
                self._conn.execute("RELEASE body")
        except sqlite3.Error as exc:
            self._lost(exc)

    def commit(self, delivered: int, rejected: int) -> None:
        if self._open is None or self._conn is None:
            raise UsageError("no epoch is open on this writer: begin one first")
        try:
            self._conn.execute(
                "INSERT OR REPLACE INTO delivered VALUES (?, ?, ?, ?, ?, ?)",
                (*self._open, delivered, rejected),
            )
            self._conn.execute("COMMIT")
        except sqlite3.Error as exc:
            self._lost(exc)
        self._end()

    def rollback(self) -> None:
        if self._lock.locked() and (self._open is not None or self._conn is not None):
            self._end()

    def close(self) -> None:
        self.rollback()

    def _lost(self, exc: sqlite3.Error) -> NoReturn:
        """A failure inside the epoch's transaction: it is rolled back, the epoch starts
        over."""
        self._end()
        raise TransactionLostError(
            f"SQLite target {_path(self._config)}: the epoch's transaction was lost ({exc})"
        ) from None

    def _end(self) -> None:
        """The epoch's transaction rolled back (a committed one has nothing left to roll
        back), its connection closed, the next epoch let in."""
        conn, self._conn, self._open = self._conn, None, None
        try:
            if conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                conn.close()
        finally:
            if self._lock.locked():
                self._lock.release()


KIND = TargetKind(
    name="sqlite",
    schemes=("sqlite",),
    resend=OVERWRITE,
    writer=SqliteWriter,
    readback=SqliteReadback,
    check=_check,
)

TX_KIND = TargetKind(
    name="sqlitetx",
    schemes=("sqlitetx",),
    resend=TRANSACTION,
    writer=SqliteEpochWriter,
    readback=SqliteReadback,
    check=_check,
)
