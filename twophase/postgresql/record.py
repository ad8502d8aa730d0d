"""The delivered record: which epochs of which sink a PostgreSQL target holds.

A small table in the target's own database, ``<target_schema>.twophase_delivered``::

    CREATE TABLE IF NOT EXISTS public.twophase_delivered (
        sink_id text NOT NULL,
        target text NOT NULL,
        epoch bigint NOT NULL,
        delivered bigint NOT NULL,
        rejected bigint NOT NULL,
        delivered_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (sink_id, target, epoch)
    );

An epoch's row (with the counts of its points delivered and rejected) is written in
the transaction that writes the epoch's points, so the rows and the record commit
together or not at all; a re-sent epoch finds its record and is skipped, and an
operator's resend, sent anyway, replaces the record with its own counts. A
transaction-level advisory lock on (sink, target, epoch) is taken before the record is
read: a second delivery of the same epoch at the same time (a run that does not know
it was replaced) waits for the first and then finds its record, instead of writing
the epoch a second time.

The table is created when missing (``CREATE TABLE IF NOT EXISTS``: the target's role
needs CREATE on the schema once), or by a DBA beforehand with the statement above
(then the role needs SELECT, INSERT and UPDATE on it).
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
from psycopg import sql

__all__ = ["RECORD_TABLE", "delivered_counts", "ensure_record", "record_ddl", "write_record"]

RECORD_TABLE = "twophase_delivered"
_LOCK_SPACE = "twophase.postgresql.epoch"  # advisory lock keys of epochs


def record_ddl(schema: str) -> sql.Composed:
    """The statement that creates the record table in ``schema``. Idempotent."""
    return sql.SQL(
        "CREATE TABLE IF NOT EXISTS {} ("
        "sink_id text NOT NULL, target text NOT NULL, epoch bigint NOT NULL, "
        "delivered bigint NOT NULL, rejected bigint NOT NULL, "
        "delivered_at timestamptz NOT NULL DEFAULT now(), "
        "PRIMARY KEY (sink_id, target, epoch))"
    ).format(sql.Identifier(schema, RECORD_TABLE))


def ensure_record(conn: psycopg.Connection[Any], schema: str) -> None:
    """Create the record table unless it exists, in a transaction of its own (so that an
    epoch's transaction takes no DDL lock on it). Two processes creating it at once:
    the one that loses the race finds it made. Idempotent."""
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", (_qualified(schema),))
        row = cur.fetchone()
        if row and row[0]:
            return
        try:
            with conn.transaction():
                cur.execute(record_ddl(schema))
        except psycopg.errors.UniqueViolation:  # created by another session meanwhile
            pass


def delivered_counts(
    cur: psycopg.Cursor[Any], schema: str, sink_id: str, target: str, epoch: int
) -> tuple[int, int] | None:
    """The (delivered, rejected) counts of the epoch's record, None when the target does
    not hold the epoch; read under the epoch's advisory lock (held to the end of the
    caller's transaction). Changes nothing."""
    cur.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
        (json.dumps([_LOCK_SPACE, sink_id, target, epoch]),),
    )
    cur.execute(
        sql.SQL(
            "SELECT delivered, rejected FROM {} WHERE sink_id = %s AND target = %s AND epoch = %s"
        ).format(sql.Identifier(schema, RECORD_TABLE)),
        (sink_id, target, epoch),
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
) -> None:
    """Record the epoch as delivered with its (delivered, rejected) counts, in the
    caller's (the epoch's) transaction; a record already there (an operator's resend)
    is replaced. Idempotent."""
    cur.execute(
        sql.SQL(
            "INSERT INTO {} (sink_id, target, epoch, delivered, rejected) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (sink_id, target, epoch) DO UPDATE "
            "SET delivered = EXCLUDED.delivered, rejected = EXCLUDED.rejected, "
            "delivered_at = now()"
        ).format(sql.Identifier(schema, RECORD_TABLE)),
        (sink_id, target, epoch, *counts),
    )


def _qualified(schema: str) -> str:
    """The record table's name as to_regclass reads it (each part quoted)."""
    return ".".join('"' + part.replace('"', '""') + '"' for part in (schema, RECORD_TABLE))
