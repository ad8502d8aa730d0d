"""A measurement's table made outside any epoch's transaction: created, or given the
field columns it lacks, in short transactions of its own on a connection of its own.

``ALTER TABLE ... ADD COLUMN`` takes the table's ACCESS EXCLUSIVE lock. Taken inside an
epoch's transaction, it would be held until the epoch commits, and every reader of the
table (a dashboard's query) would wait for the whole epoch. And while it waits for a
reader's lock, the readers that come after it queue behind it. So each try runs in a
transaction of its own that waits at most ``LOCK_TRY_S`` for its locks (PostgreSQL's
``lock_timeout``, for that transaction only) and commits at once; a try that found the
table locked is repeated after a pause, in which the readers queued behind it go on,
until ``target_lock_timeout`` has passed since the first try (0: without end). Then
the last try's lock error is raised, which the writer classifies as one that may pass
(the epoch starts over, and its target lags past its deadline).

An epoch's transaction that wrote to a table already holds a lock on it, which the
column's transaction would wait for in vain: the writer ends the epoch first
([`EpochStartOverError`][twophase.errors.EpochStartOverError]). Idempotent: a table or
a column made meanwhile by another writer is found, under the table's advisory lock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg

from twophase.postgresql import tables
from twophase.postgresql.tables import TableShape

__all__ = ["LOCK_TRY_S", "Wanted", "make_table"]

log = logging.getLogger("twophase.postgresql.ddl")

# The longest one try waits for the table's lock: what a reader arriving meanwhile may
# wait behind it. The pause after a try that found it locked lets those readers through.
LOCK_TRY_S = 0.5
_PAUSE_S = 0.5


@dataclass(frozen=True)
class Wanted:
    """What a body needs of its measurement's table: its tag columns (a table created
    has them, in this order) and its field columns with their types."""

    tags: tuple[str, ...] = ()
    fields: Mapping[str, str] = field(default_factory=dict)


def make_table(
    conn: psycopg.Connection[Any],
    schema: str,
    table: str,
    wanted: Wanted,
    lock_timeout_s: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> TableShape:
    """The table created with ``wanted``, or given the field columns of it that it
    lacks, each try a committed transaction of ``conn`` (in autocommit) waiting at
    most ``LOCK_TRY_S`` for its locks; tried again until ``lock_timeout_s`` has passed
    (0: without end). Its shape once made; psycopg's error of the last try, or of any
    other failure, raised as it is. Idempotent."""
    wait_s = LOCK_TRY_S if lock_timeout_s <= 0 else min(LOCK_TRY_S, lock_timeout_s)
    until = clock() + lock_timeout_s
    tries = 0
    while True:
        tries += 1
        try:
            return _try(conn, schema, table, wanted, wait_s)
        except psycopg.errors.LockNotAvailable:
            left = until - clock()
            if lock_timeout_s > 0 and left <= 0:
                log.warning(
                    "table %s stayed locked by other sessions through %d tries of %gs "
                    "(target_lock_timeout %gs): its columns were not made",
                    tables.shown(schema, table),
                    tries,
                    wait_s,
                    lock_timeout_s,
                )
                raise
            sleep(_PAUSE_S if lock_timeout_s <= 0 else min(_PAUSE_S, left))


def _try(
    conn: psycopg.Connection[Any], schema: str, table: str, wanted: Wanted, wait_s: float
) -> TableShape:
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SELECT set_config('lock_timeout', %s, true)", (f"{_ms(wait_s)}ms",))
        tables.lock_table_name(cur, schema, table)
        shape = tables.read_shape(cur, schema, table)
        if shape is None:
            tables.create_table(cur, schema, table, wanted.tags, wanted.fields)
        else:
            missing = {k: v for k, v in wanted.fields.items() if k not in shape.columns}
            if not missing:
                return shape  # made meanwhile by another writer
            tables.add_fields(cur, shape, missing)
        made = tables.read_shape(cur, schema, table)
    assert made is not None
    return made


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))
