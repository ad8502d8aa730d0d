"""Writing line protocol to a PostgreSQL target: an epoch in one transaction.

[`PostgresWriter`][twophase.postgresql.writer.PostgresWriter] is an
[`EpochWriter`][twophase.targets.contract.EpochWriter]. ``begin`` opens the epoch's
transaction and reads the target's delivered record
([`twophase.postgresql.record`][twophase.postgresql.record]): the record's counts, and
nothing sent, when the epoch is there already in the generation ``begin`` names. Each
``write`` upserts its body's rows (``COPY`` into a temporary table, then ``INSERT ...
ON CONFLICT (time, tags) DO UPDATE``) inside a savepoint: a plain body streamed
([`twophase.postgresql.streamed`][twophase.postgresql.streamed]: its lines turned into
``COPY`` rows by one pattern, PostgreSQL parsing the values), any other (or one whose
values PostgreSQL refuses there) read point by point, every point checked against its
measurement's table ([`twophase.postgresql.tables`][twophase.postgresql.tables]). A
refused body leaves the transaction as it was before it, so that the sender can send
its other lines again. ``commit`` writes the epoch's record (its counts) and commits:
the rows and the record become visible together.

A table or field column the body needs (``target_create_tables``) is made before its
rows, on a connection opened for it, in short transactions of its own
([`twophase.postgresql.ddl`][twophase.postgresql.ddl]), never in the epoch's: readers
of the table do not wait for the epoch. A column for a table the epoch's transaction
wrote to already cannot be added while it holds its lock: the epoch is ended, the
column added, and ``EpochStartOverError`` raised (the delivery sends the epoch again
at once). A made table or column stays when its epoch fails, and is found again.

Idempotent twice over: a point written again replaces its row with itself (last write
wins, field by field), and an epoch delivered again is skipped by its record. Outside
``begin``/``commit``, ``write`` commits each body on its own (an upsert, so a body sent
again changes nothing).
"""

from __future__ import annotations

import contextlib
import threading
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from twophase.bounded import inflate
from twophase.errors import (
    BadPointsError,
    EpochStartOverError,
    LineProtocolError,
    RetryableError,
    TargetRequestError,
    TransactionLostError,
    TransientWriteError,
    TwoPhaseError,
    UsageError,
)
from twophase.points.lineproto import FieldValue, ParsedPoint, Tags, parse_line
from twophase.postgresql import ddl, record, streamed, tables
from twophase.postgresql.connect import classify, connect, create_tables, display_url, schema_of
from twophase.postgresql.tables import TableShape

if TYPE_CHECKING:
    from twophase.config import TargetConfig

__all__ = ["PostgresWriter"]

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_ROWS = sql.Identifier("pg_temp", "twophase_rows")  # a body's rows, before the upsert
# The most a gzip body may inflate to: a request is at most batch_bytes of lines, and
# a line on its own up to the 64 MiB a staged line may hold.
_MAX_LINE_BYTES = 64 << 20
_REFUSED_CLASSES = ("22", "23")  # data exceptions, integrity constraint violations
# What a streamed body leaves to the reading point by point: the classes above, and a
# row touched twice by one upsert (a point written twice in the body, merged there).
_NOT_STREAMED_CLASSES = ("21", *_REFUSED_CLASSES)


@dataclass(frozen=True)
class _Line:
    """One line of a body: its index among the body's lines, its text, and the point
    it reads as or why it cannot be one."""

    index: int
    text: str
    point: ParsedPoint | None
    problem: str | None = None


@dataclass
class _Rows:
    """A measurement's rows of one body, a point written twice in it merged (the later
    value of a field wins, as InfluxDB keeps it): ON CONFLICT may touch a row once."""

    fields: dict[str, None] = field(default_factory=dict)  # in order of first use
    rows: dict[tuple[int, Tags], dict[str, FieldValue]] = field(default_factory=dict)


class PostgresWriter:
    """Writes a PostgreSQL target's epochs, one transaction each (see the module).

    One epoch at a time: ``begin`` waits while another epoch of this writer is open
    (a transactional kind delivers over one lane). The connection is opened on first
    use and opened again after it was lost; another, for the time it takes to make a
    table or its columns. Table shapes are cached, and read again after any failure (a
    table may have changed meanwhile).
    """

    def __init__(self, config: TargetConfig) -> None:
        self._config = config
        self._schema = schema_of(config)
        self._create = create_tables(config)
        self._inflate_limit = max(2 * config.batch_bytes, _MAX_LINE_BYTES)
        self._conn: psycopg.Connection[Any] | None = None
        self._record_ready = False
        self._shapes: dict[str, TableShape] = {}
        self._epoch_lock = threading.Lock()
        self._holding = False
        self._open: tuple[str, int, str, int] | None = None  # sink, epoch, target, generation
        self._touched: set[str] = set()  # the tables the open epoch wrote to

    # --- the epoch ---------------------------------------------------------

    def begin(
        self, sink_id: str, epoch: int, target: str, again: bool = False, *, generation: int = 0
    ) -> tuple[int, int] | None:
        """Open the epoch's transaction and return None; or, when the target's record
        holds the epoch already in ``generation``, return its (delivered, rejected)
        counts with nothing left open (a record of another generation is inert).
        ``again`` (an operator's resend) opens it even so: the record is replaced at the
        commit. Idempotent: a delivered epoch is skipped."""
        if self._open is not None and self._holding:
            raise UsageError("an epoch is open on this writer already: commit or roll it back")
        self._epoch_lock.acquire()
        self._holding = True
        with self._ended_on_failure():
            conn = self._connection()
            if not self._record_ready:
                record.ensure_record(conn, self._schema)
                self._record_ready = True
            with conn.cursor() as cur:
                counts = record.delivered_counts(
                    cur, self._schema, sink_id, target, epoch, generation
                )
        if counts is not None and not again:  # its transaction ended, and its lock
            self._end(rollback=True)
            return counts
        self._open = (sink_id, epoch, target, generation)
        return None

    def write(self, body: bytes, gzipped: bool = False) -> None:
        """Upsert a body's points: into the open epoch's transaction, or committed on its
        own when no epoch is open. A refused line raises BadPointsError naming it
        (``line``) with nothing of the body written; a row PostgreSQL refuses raises it
        without a line (the sender takes the body apart)."""
        if self._open is not None:
            self._write_in_epoch(body, gzipped)
            return
        with self._epoch_lock:
            self._write_alone(body, gzipped)

    def commit(self, delivered: int, rejected: int) -> None:
        """Record the epoch as delivered, with the counts of its points delivered and
        rejected, and commit: its rows and record become visible together.
        TransactionLostError when the connection is lost (committed or not: a new
        ``begin`` tells by the record)."""
        if self._open is None:
            raise UsageError("no epoch is open on this writer: begin one first")
        sink_id, epoch, target, generation = self._open
        with self._ended_on_failure():
            conn = self._epoch_connection()
            with conn.cursor() as cur:
                counts = (delivered, rejected)
                record.write_record(cur, self._schema, sink_id, target, epoch, counts, generation)
            conn.commit()
        self._end()

    @contextlib.contextmanager
    def _ended_on_failure(self) -> Iterator[None]:
        """A step of the epoch: on any failure the epoch is ended (rolled back, its lock
        released) and a PostgreSQL error raised classified."""
        try:
            yield
        except psycopg.Error as exc:
            error = self._failed(exc, in_transaction=True)  # before the rollback
            self._end(failed=True)
            raise error from None
        except BaseException:
            self._end(failed=True)
            raise

    def rollback(self) -> None:
        """End the open epoch without a trace; nothing when none is open."""
        if self._holding:
            self._end(failed=True)

    def close(self) -> None:
        self.rollback()
        self._close_connection()

    # --- bodies --------------------------------------------------------------

    def _write_in_epoch(self, body: bytes, gzipped: bool) -> None:
        try:
            raw = self._inflated(body, gzipped)
            conn = self._epoch_connection()
            if self._streamed(conn, raw, in_epoch=True):
                return
            lines = self._lines(raw)
            with conn.cursor() as cur:  # before the savepoint: the epoch may be ended
                shapes = self._shapes_for(cur, lines, in_epoch=True)
            self._touched.update(shapes)  # locked from here on, whatever the outcome
            with conn.transaction(), conn.cursor() as cur:  # a savepoint: the body's
                self._write_lines(cur, lines, shapes)
        except BadPointsError:  # the body refused, rolled back to its savepoint: the epoch goes on
            raise
        except psycopg.Error as exc:
            refused = self._refused(exc)
            if refused is not None and not self._broken():
                self._shapes.clear()
                raise refused from None
            error = self._failed(exc, in_transaction=True)  # before the rollback
            self._end(failed=True)
            raise error from None
        except BaseException:
            self._end(failed=True)
            raise

    def _write_alone(self, body: bytes, gzipped: bool) -> None:
        raw = self._inflated(body, gzipped)
        conn = self._connection()
        try:
            with conn.transaction():
                if self._streamed(conn, raw, in_epoch=False):
                    return
                lines = self._lines(raw)
                with conn.cursor() as cur:
                    self._write_lines(cur, lines, self._shapes_for(cur, lines, in_epoch=False))
        except psycopg.Error as exc:
            self._shapes.clear()
            refused = self._refused(exc)
            if refused is not None and not self._broken():
                raise refused from None
            raise self._failed(exc, in_transaction=False) from None

    def _inflated(self, body: bytes, gzipped: bool) -> bytes:
        """The body's text (a gzip body inflated within its bound)."""
        if not gzipped:
            return body
        try:
            return inflate(body, self._inflate_limit, "a request body")
        except zlib.error as exc:
            raise TargetRequestError(f"a gzip request body is damaged: {exc}") from None

    def _lines(self, body: bytes) -> list[_Line]:
        """The body's lines, read point by point."""
        pieces = (piece for piece in body.split(b"\n") if piece.strip())
        return [_read_line(index, piece) for index, piece in enumerate(pieces)]

    def _streamed(self, conn: psycopg.Connection[Any], body: bytes, *, in_epoch: bool) -> bool:
        """Whether the body was written streamed
        ([`twophase.postgresql.streamed`][twophase.postgresql.streamed]), in a savepoint
        of the caller's transaction; False, with nothing of it written, for a body to
        read point by point (not of one plain shape, or a value PostgreSQL refused)."""
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            return False
        keys = streamed.first_keys(text)
        if keys is None:
            return False
        first = _read_line(0, text.partition("\n")[0].encode("utf-8"))
        if first.point is None or first.problem is not None or first.point.measurement != keys[0]:
            return False
        with conn.cursor() as cur:
            shape = self._shapes_for(cur, [first], in_epoch=in_epoch)[keys[0]]
        how = streamed.plan(keys, shape)
        copied = None if how is None else streamed.rows(text, how)
        if how is None or copied is None:
            return False
        if in_epoch:
            self._touched.add(keys[0])  # locked from here on, whatever the outcome
        try:
            with conn.transaction(), conn.cursor() as cur:
                streamed.load(cur, how, copied)
        except psycopg.Error as exc:
            if self._broken() or not _data_error(exc):
                raise
            return False
        return True

    def _write_lines(
        self, cur: psycopg.Cursor[Any], lines: list[_Line], shapes: dict[str, TableShape]
    ) -> None:
        """Check every line against its table's ``shapes``, then upsert each
        measurement's rows (inside the caller's transaction or savepoint): the first
        refused line raises before any row."""
        groups = _groups(lines)
        first = next((line for line in lines if self._problem(line, shapes)), None)
        if first is not None:
            reason = self._problem(first, shapes) or ""
            raise BadPointsError(
                f"PostgreSQL target {display_url(self._config)} refused line {first.index}: "
                f"{reason}",
                reason,
                line=first.index,
                original=first.text,
            )
        for measurement, group in groups.items():
            _upsert(cur, shapes[measurement], _rows(group))

    def _problem(self, line: _Line, shapes: dict[str, TableShape]) -> str | None:
        if line.problem is not None or line.point is None:
            return line.problem
        return tables.point_problem(line.point, shapes[line.point.measurement])

    # --- tables ---------------------------------------------------------------

    def _shapes_for(
        self, cur: psycopg.Cursor[Any], lines: list[_Line], *, in_epoch: bool
    ) -> dict[str, TableShape]:
        """The table of each measurement of ``lines``, read (through ``cur``), and made
        to take their points with ``target_create_tables`` (created, or given their new
        field columns: ``_make``); TargetRequestError for a missing one without. In the
        epoch, a table it wrote to already that needs a column ends the epoch first,
        then EpochStartOverError once the column is there."""
        shapes: dict[str, TableShape] = {}
        wanted: dict[str, ddl.Wanted] = {}
        for measurement, group in _groups(lines).items():
            shape = self._shapes.get(measurement) or tables.read_shape(
                cur, self._schema, measurement
            )
            need = self._wanted(measurement, shape, group)
            if need is None:
                assert shape is not None
                shapes[measurement] = self._shapes[measurement] = shape
            else:
                wanted[measurement] = need
        held = sorted(m for m in wanted if in_epoch and m in self._touched)
        if held:
            self._end(failed=True)  # its locks released: the columns' transaction can go on
        for measurement, need in wanted.items():
            shapes[measurement] = self._shapes[measurement] = self._make(
                measurement, need, in_epoch=in_epoch
            )
        if held:
            raise EpochStartOverError(
                f"PostgreSQL target {display_url(self._config)}: "
                f"{', '.join(tables.shown(self._schema, m) for m in held)} got new field "
                "columns in a transaction of their own, which could not wait for the "
                "epoch's (it had written to them): the epoch starts over, nothing of it "
                "was committed"
            )
        return shapes

    def _wanted(
        self, measurement: str, shape: TableShape | None, lines: list[_Line]
    ) -> ddl.Wanted | None:
        """What the table must be given to take the lines' points (None: nothing, or
        not ours to make without ``target_create_tables``, where the points are
        checked against the table as it is)."""
        if shape is None and not self._create:
            raise TargetRequestError(
                f"table {tables.shown(self._schema, measurement)} does not exist on PostgreSQL "
                f"target {display_url(self._config)}: create it (time timestamptz NOT NULL, a "
                "text column per tag, a column per field, UNIQUE (time, tags...)), or set "
                "target_create_tables"
            )
        points = [line.point for line in lines if line.point is not None]
        keys = {key for point in points for key in point.fields} - {tables.TIME}
        if shape is not None and (not self._create or keys <= shape.columns.keys()):
            return None  # the usual body: no column to make, no types to work out
        fields = {k: v for k, v in _field_types(points).items() if k != tables.TIME}
        named = {key for point in points for key, _ in point.tags}
        return ddl.Wanted(tuple(sorted(named - set(fields) - {tables.TIME})), fields)

    def _make(self, measurement: str, wanted: ddl.Wanted, *, in_epoch: bool) -> TableShape:
        """The table made (``ddl.make_table``) on a connection of its own, opened for
        it (tables are made seldom); its failures classified as the epoch's when one is
        open (``in_epoch``: one that may pass is then a lost transaction, the epoch
        starting over)."""
        try:
            conn = connect(self._config, autocommit=True)
        except TransientWriteError as exc:
            if not in_epoch:
                raise
            raise TransactionLostError(f"{exc}; nothing of the epoch was committed") from None
        try:
            return ddl.make_table(
                conn, self._schema, measurement, wanted, self._config.postgresql.lock_timeout_s
            )
        except psycopg.Error as exc:
            error = classify(exc, self._config, in_transaction=in_epoch, broken=conn.broken)
            raise error from None
        finally:
            conn.close()

    # --- the connection ---------------------------------------------------------

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = None
            self._record_ready = False
            self._conn = connect(self._config)
        return self._conn

    def _epoch_connection(self) -> psycopg.Connection[Any]:
        """The open epoch's connection; TransactionLostError when it is gone (a new one
        would hold none of the epoch, and must never commit the rest of it)."""
        if self._broken():
            raise TransactionLostError(
                f"PostgreSQL target {display_url(self._config)}: the connection of the "
                "epoch's transaction is gone; nothing of it was committed"
            )
        assert self._conn is not None
        return self._conn

    def _broken(self) -> bool:
        return self._conn is None or self._conn.closed or self._conn.broken

    def _drop_if_broken(self) -> None:
        if self._conn is not None and self._broken():
            self._conn.close()
            self._conn = None

    def _close_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _failed(self, exc: psycopg.Error, *, in_transaction: bool) -> TwoPhaseError:
        """The failure classified; the connection closed when it may pass (the next
        attempt connects again: to the new primary after a failover, say)."""
        error = classify(exc, self._config, in_transaction=in_transaction, broken=self._broken())
        if isinstance(error, RetryableError) or self._broken():
            self._close_connection()
        return error

    def _refused(self, exc: psycopg.Error) -> BadPointsError | None:
        """PostgreSQL's refusal of a body's rows (a data or constraint error), as
        BadPointsError with its message; None for any other failure."""
        state = getattr(exc, "sqlstate", None) or ""
        if not state.startswith(_REFUSED_CLASSES):
            return None
        diag = exc.diag
        reason = diag.message_primary or str(exc).strip().splitlines()[0]
        if diag.message_detail:
            reason = f"{reason} ({diag.message_detail})"
        return BadPointsError(
            f"PostgreSQL target {display_url(self._config)} refused rows: {reason} ({state})",
            f"PostgreSQL: {reason}",
        )

    def _end(self, failed: bool = False, rollback: bool = False) -> None:
        """Close the epoch: its transaction rolled back when it ``failed`` (the shapes
        forgotten then: a table may have changed) or on ``rollback``, a lost connection
        dropped; the epoch lock released."""
        try:
            self._touched.clear()
            if failed:
                self._shapes.clear()
            if failed or rollback:
                self._quiet_rollback()
        finally:
            self._open = None
            if self._holding:
                self._holding = False
                self._epoch_lock.release()

    def _quiet_rollback(self) -> None:
        if self._conn is None:
            return
        try:
            self._conn.rollback()
        except psycopg.Error:
            self._conn.close()
        self._drop_if_broken()


def _read_line(index: int, raw: bytes) -> _Line:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        shown = raw.decode("utf-8", "replace")
        return _Line(index, shown, None, "the line is not UTF-8 text")
    try:
        point = parse_line(text)
    except LineProtocolError as exc:
        return _Line(index, text, None, f"not a line of line protocol: {exc}")
    if point.measurement == record.RECORD_TABLE:
        problem = f"measurement {point.measurement!r} is the name of twophase's delivered record"
        return _Line(index, text, point, problem)
    return _Line(index, text, point, tables.names_problem(point))


def _data_error(exc: psycopg.Error) -> bool:
    return (getattr(exc, "sqlstate", None) or "").startswith(_NOT_STREAMED_CLASSES)


def _groups(lines: list[_Line]) -> dict[str, list[_Line]]:
    """The lines that read as points, by measurement (in order of first use)."""
    groups: dict[str, list[_Line]] = {}
    for line in lines:
        if line.point is not None and line.problem is None:
            groups.setdefault(line.point.measurement, []).append(line)
    return groups


def _field_types(points: Sequence[ParsedPoint]) -> dict[str, str]:
    """Each field's column type, from its first value among ``points``."""
    types: dict[str, str] = {}
    for point in points:
        for key, value in point.fields.items():
            types.setdefault(key, tables.column_type(value))
    return types


def _rows(lines: list[_Line]) -> _Rows:
    """The lines' points as rows keyed on (time in microseconds, tags)."""
    rows = _Rows()
    for line in lines:
        point = line.point
        assert point is not None and point.time_ns is not None
        merged = rows.rows.setdefault((point.time_ns // 1000, point.tags), {})
        merged.update(point.fields)
        rows.fields.update(dict.fromkeys(point.fields))
    return rows


def _upsert(cur: psycopg.Cursor[Any], shape: TableShape, rows: _Rows) -> None:
    """The rows into the table: COPY into a temporary table, then one INSERT ... ON
    CONFLICT that sets the fields a row was given (the others keep their values)."""
    fields = list(rows.fields)
    columns = [tables.TIME, *shape.tags, *fields]
    names = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    target = sql.Identifier(shape.schema, shape.name)
    cur.execute(
        sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA").format(
            _ROWS, names, target
        )
    )
    with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(_ROWS, names)) as copy:
        for row in _copy_rows(shape, fields, rows.rows):
            copy.write_row(row)
    updates = sql.SQL(", ").join(
        sql.SQL("{0} = COALESCE(EXCLUDED.{0}, old.{0})").format(sql.Identifier(f)) for f in fields
    )
    key = sql.SQL(", ").join(sql.Identifier(c) for c in shape.key)
    cur.execute(
        sql.SQL(
            "INSERT INTO {} AS old ({}) SELECT {} FROM {} ON CONFLICT ({}) DO UPDATE SET {}"
        ).format(target, names, names, _ROWS, key, updates)
    )
    cur.execute(sql.SQL("DROP TABLE {}").format(_ROWS))


def _copy_rows(
    shape: TableShape,
    fields: list[str],
    rows: dict[tuple[int, Tags], dict[str, FieldValue]],
) -> Iterator[tuple[object, ...]]:
    for (micros, tag_items), values in rows.items():
        tags = dict(tag_items)
        yield (
            _EPOCH + timedelta(microseconds=micros),
            *(tags.get(tag, "") for tag in shape.tags),
            *(values.get(name) for name in fields),
        )
