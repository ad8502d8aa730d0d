"""The delivered record: which epochs of which sink a PostgreSQL target holds.

A small table in the target's own database, ``<target_schema>.twophase_delivered``::

    CREATE TABLE IF NOT EXISTS public.twophase_delivered (
        sink_id text NOT NULL,
        target text NOT NULL,
        epoch bigint NOT NULL,
        delivered bigint NOT NULL,
        rejected bigint NOT NULL,
        delivered_at timestamptz NOT NULL DEFAULT now(),
        generation bigint NOT NULL DEFAULT 0,
        PRIMARY KEY (sink_id, target, generation, epoch)
    );

An epoch's row (with the counts of its points delivered and rejected) is written in
the transaction that writes the epoch's points, so the rows and the record commit
together or not at all; a re-sent epoch finds its record and is skipped, and an
operator's resend, sent anyway, replaces the record with its own counts.

A record names the *generation* of the epoch numbers it was delivered under, as the
staging store gives it for the sink's target (``twophase_targets.generation``). A
``twophase reset`` lets the next query number its epochs from 0 again, and a ``targets
resync --from-epoch`` sends epochs the target may hold again: each starts a new
generation, so the records of the old numbers are inert (never found again) without
the staging store having to reach into the target's database. Only a record of the
epoch's own generation skips it: a re-send within one generation (a crash after the
target's commit, before the staging store recorded the delivery) is still found.

A transaction-level advisory lock on (sink, target, generation, epoch) is taken before
the record is read: a second delivery of the same epoch at the same time (a run that
does not know it was replaced) waits for the first and then finds its record, instead
of writing the epoch a second time.

The table is created when missing (``CREATE TABLE IF NOT EXISTS``: the target's role
needs CREATE on the schema once), or by a DBA beforehand with the statement above
(then the role needs SELECT, INSERT and UPDATE on it). A table of an older version
(without ``generation``) is upgraded in place the first time a writer finds it: the
column added (every existing record in generation 0, the generation of every sink
until its first reset) and the key changed, in a transaction of its own that waits a
short while for the table's lock (``ALTER TABLE`` needs the table's owner; a role that
is not is refused with the statement to run).
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
from psycopg import sql

from twophase.errors import TargetAuthError, TransientWriteError

__all__ = [
    "RECORD_TABLE",
    "delivered_counts",
    "ensure_record",
    "record_ddl",
    "upgrade_ddl",
    "write_record",
]

RECORD_TABLE = "twophase_delivered"
_LOCK_SPACE = "twophase.postgresql.epoch"  # advisory lock keys of epochs
_KEY = ("sink_id", "target", "generation", "epoch")
# How long the upgrade of an older record waits for the table's lock: the ALTER queues
# every other writer of the table behind it while it waits, so it gives up soon (and is
# tried again) rather than stall them behind an older version's open epoch.
_UPGRADE_LOCK_WAIT = "2s"


def record_ddl(schema: str) -> sql.Composed:
    """The statement that creates the record table in ``schema``. Idempotent."""
    return sql.SQL(
        "CREATE TABLE IF NOT EXISTS {} ("
        "sink_id text NOT NULL, target text NOT NULL, epoch bigint NOT NULL, "
        "delivered bigint NOT NULL, rejected bigint NOT NULL, "
        "delivered_at timestamptz NOT NULL DEFAULT now(), "
        "generation bigint NOT NULL DEFAULT 0, "
        "PRIMARY KEY (sink_id, target, generation, epoch))"
    ).format(sql.Identifier(schema, RECORD_TABLE))


def upgrade_ddl(schema: str, key_name: str | None) -> sql.Composed:
    """The statement that upgrades a record table of an older version in place: the
    ``generation`` column (0 for every record there) and the key that names it, the
    older key (``key_name``) dropped."""
    drop: sql.Composable = sql.SQL("")
    if key_name is not None:
        drop = sql.SQL(", DROP CONSTRAINT {}").format(sql.Identifier(key_name))
    return sql.SQL(
        "ALTER TABLE {} ADD COLUMN IF NOT EXISTS generation bigint NOT NULL DEFAULT 0{}, "
        "ADD PRIMARY KEY ({})"
    ).format(
        sql.Identifier(schema, RECORD_TABLE),
        drop,
        sql.SQL(", ").join(sql.Identifier(c) for c in _KEY),
    )


def ensure_record(conn: psycopg.Connection[Any], schema: str) -> None:
    """Create the record table unless it exists, or upgrade an older version's in place,
    in a transaction of its own (so that an epoch's transaction takes no DDL lock on it).
    Two processes creating or upgrading it at once: the one that loses the race finds
    it made. TransientWriteError when the table's lock was not had within a short wait
    (tried again later); TargetAuthError, with the statement to run, when the role may
    not alter it. Idempotent."""
    with conn.transaction(), conn.cursor() as cur:
        found, key, columns = _shape(cur, schema)
        if found and columns == _KEY:
            return
        if found:
            _upgrade(conn, cur, schema, key)
            return
        try:
            with conn.transaction():
                cur.execute(record_ddl(schema))
        except psycopg.errors.UniqueViolation:  # created by another session meanwhile
            pass


def _shape(cur: psycopg.Cursor[Any], schema: str) -> tuple[bool, str | None, tuple[str, ...]]:
    """Whether the record table exists, the name of its primary key and the key's
    columns in order."""
    cur.execute(
        "SELECT c.oid IS NOT NULL, k.conname, ARRAY(SELECT a.attname::text"
        " FROM unnest(k.conkey) WITH ORDINALITY AS u(attnum, n)"
        " JOIN pg_attribute a ON a.attrelid = k.conrelid AND a.attnum = u.attnum"
        " ORDER BY u.n) FROM (SELECT to_regclass(%s) AS oid) c"
        " LEFT JOIN pg_constraint k ON k.conrelid = c.oid AND k.contype = 'p'",
        (_qualified(schema),),
    )
    row = cur.fetchone()
    assert row is not None
    return bool(row[0]), row[1], tuple(row[2] or ())


def _upgrade(
    conn: psycopg.Connection[Any], cur: psycopg.Cursor[Any], schema: str, key: str | None
) -> None:
    """An older version's record table given the generation, under its lock (its shape
    read again once the lock is held: another process may have upgraded it)."""
    statement = upgrade_ddl(schema, key)
    try:
        cur.execute("SELECT set_config('lock_timeout', %s, true)", (_UPGRADE_LOCK_WAIT,))
        table = sql.Identifier(schema, RECORD_TABLE)
        cur.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(table))
        _, key, columns = _shape(cur, schema)
        if columns != _KEY:
            statement = upgrade_ddl(schema, key)
            cur.execute(statement)
    except psycopg.errors.LockNotAvailable:
        raise TransientWriteError(
            f"the delivered record {_qualified(schema)} of a PostgreSQL target is in use "
            f"(its upgrade to name the generation waited {_UPGRADE_LOCK_WAIT} for the "
            "table's lock): tried again"
        ) from None
    except psycopg.errors.InsufficientPrivilege:
        raise TargetAuthError(
            f"the delivered record {_qualified(schema)} of a PostgreSQL target is of an "
            "older version and the target's role may not alter it: have its owner run "
            f"{statement.as_string(conn)}"
        ) from None


def delivered_counts(
    cur: psycopg.Cursor[Any],
    schema: str,
    sink_id: str,
    target: str,
    epoch: int,
    generation: int = 0,
) -> tuple[int, int] | None:
    """The (delivered, rejected) counts of the epoch's record in ``generation``, None
    when the target does not hold the epoch in it (a record of another generation is
    inert); read under the epoch's advisory lock (held to the end of the caller's
    transaction). Changes nothing."""
    cur.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
        (json.dumps([_LOCK_SPACE, sink_id, target, generation, epoch]),),
    )
    cur.execute(
        sql.SQL(
            "SELECT delivered, rejected FROM {} WHERE sink_id = %s AND target = %s"
            " AND generation = %s AND epoch = %s"
        ).format(sql.Identifier(schema, RECORD_TABLE)),
        (sink_id, target, generation, epoch),
    )
    row = cur.fetchone()
    return None if row is None else (int(row[0]), int(row[1]))


def write_record(
    cur: psycopg.Cursor[Any],
    schema: str,
    sink_id: str,
    target: str,
    epoch: int,
    counts: tuple[int, int],
    generation: int = 0,
) -> None:
    """Record the epoch as delivered in ``generation`` with its (delivered, rejected)
    counts, in the caller's (the epoch's) transaction; a record already there (an
    operator's resend) is replaced. Idempotent."""
    cur.execute(
        sql.SQL(
            "INSERT INTO {} (sink_id, target, generation, epoch, delivered, rejected) "
            "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (sink_id, target, generation, epoch)"
            " DO UPDATE SET delivered = EXCLUDED.delivered, rejected = EXCLUDED.rejected, "
            "delivered_at = now()"
        ).format(sql.Identifier(schema, RECORD_TABLE)),
        (sink_id, target, generation, epoch, *counts),
    )


def _qualified(schema: str) -> str:
    """The record table's name as to_regclass reads it (each part quoted)."""
    return ".".join('"' + part.replace('"', '""') + '"' for part in (schema, RECORD_TABLE))
