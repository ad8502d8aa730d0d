"""Least privilege in the staging store: what each of twophase's roles may do there.

Four kinds of process talk to the staging store, and each may run as a role
of its own:

* ``executor``: the Spark tasks, which stage
  ([`twophase.protocol.stage.stager`][twophase.protocol.stage.stager]): a write's chunks, its
  stage-time dead letters and its row, and the read-back of a cut attempt.
* ``driver``: the process that commits a sink, the whole protocol: a run's claim,
  decide, promote, mark, the targets' cursors and catch-up, promote-time dead
  letters, a replay's discarded writes, automatic GC and a run's end. It stages too
  (a driver of the Python API, Spark in local mode), so it has the executor's grants.
* ``operator``: the CLI's commands that change the store (``recover``, ``resend``,
  ``dead-letters --requeue``, ``targets resync``, ``abort``, ``gc``, ``reset``): the
  driver's grants, and what a reset, an abort and a requeue change besides.
* ``reader``: reads only: the exporter, ``verify``, ``status``, ``epochs``,
  ``dead-letters`` (list and export), ``targets``, ``db current`` and ``db history``.

No role may change the schema: its owner migrates it (``twophase db upgrade``).
[`GRANTS`][twophase.store.least_privilege.GRANTS] is the one place that says which object each
role may touch and how; a test holds it to every ``twophase_*`` table, view and
sequence of the migrated schema, so an object a new revision adds fails the tests
until it is listed here. The driver and the operator also use what PostgreSQL lets
every role use unless a DBA revoked it from ``PUBLIC``: the session-level advisory
locks (``pg_try_advisory_lock``, ``hashtextextended``), ``pg_locks`` and
``pg_stat_activity``, and ``pg_terminate_backend``, which ends a fenced run's lock
session only when it is of the same role (or the caller is a member of that role, or
of ``pg_signal_backend``): so every driver process of a sink runs as one role. A
waiter that may not end such a session names it, with the command or grant that
would end it, and gives up after ``staging_retry_deadline``
([`locks.take`][twophase.store.locks.take]).

[`statements`][twophase.store.least_privilege.statements] writes the GRANTs for existing roles;
[`apply`][twophase.store.least_privilege.apply] runs them as the schema's owner, all or
nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from twophase.errors import PermanentError, UsageError
from twophase.store.database import VERSION_TABLE, Database

EXECUTOR, DRIVER, OPERATOR, READER = "executor", "driver", "operator", "reader"
ROLES = (EXECUTOR, DRIVER, OPERATOR, READER)
TABLE, VIEW, SEQUENCE = "table", "view", "sequence"
DEFAULT_SCHEMA = "public"

SELECT, INSERT, UPDATE, DELETE, USAGE = "SELECT", "INSERT", "UPDATE", "DELETE", "USAGE"
# PostgreSQL's SQLSTATE for a GRANT that granted less than asked (a warning, not an
# error): the role running it neither owns the object nor holds the grant option.
_NOT_GRANTED = "01007"


@dataclass(frozen=True)
class Grant:
    """What each role may do with one object of the staging schema (empty: nothing),
    and why."""

    name: str
    kind: str
    executor: tuple[str, ...] = ()
    driver: tuple[str, ...] = ()
    operator: tuple[str, ...] = ()
    reader: tuple[str, ...] = ()
    why: str = ""

    def privileges(self, role: str) -> tuple[str, ...]:
        """The privileges of ``role`` (one of ``ROLES``) on this object."""
        found: tuple[str, ...] = getattr(self, role)
        return found


GRANTS: tuple[Grant, ...] = (
    Grant(
        VERSION_TABLE,
        TABLE,
        executor=(SELECT,),
        driver=(SELECT,),
        operator=(SELECT,),
        reader=(SELECT,),
        why="every process checks the schema revision when it connects",
    ),
    Grant(
        "twophase_sinks",
        TABLE,
        driver=(SELECT, INSERT, UPDATE),
        operator=(SELECT, INSERT, UPDATE),
        reader=(SELECT,),
        why="a run's claim makes the row; decide and mark lock it (fencing) and keep its totals",
    ),
    Grant(
        "twophase_runs",
        TABLE,
        driver=(SELECT, INSERT, UPDATE),
        operator=(SELECT, INSERT, UPDATE),
        reader=(SELECT,),
        why="a run's claim records the run, its end updates it",
    ),
    Grant(
        "twophase_epochs",
        TABLE,
        driver=(SELECT, INSERT, UPDATE, DELETE),
        operator=(SELECT, INSERT, UPDATE, DELETE),
        reader=(SELECT,),
        why="decide inserts; promotion, mark, abort and GC update; GC's compaction and a"
        " reset delete",
    ),
    Grant(
        "twophase_writes",
        TABLE,
        executor=(SELECT, INSERT),
        driver=(SELECT, INSERT, DELETE),
        operator=(SELECT, INSERT, DELETE),
        reader=(SELECT,),
        why="staging inserts (and reads a cut attempt back); GC (orphans, compaction) and a"
        " replay's discard delete",
    ),
    Grant(
        "twophase_staged_chunks",
        TABLE,
        executor=(INSERT,),
        driver=(SELECT, INSERT, DELETE),
        operator=(SELECT, INSERT, DELETE),
        reader=(SELECT,),
        why="staging copies chunks in, promotion and verify read them, GC and abort delete",
    ),
    Grant(
        "twophase_dead_letters",
        TABLE,
        executor=(INSERT,),
        driver=(SELECT, INSERT, DELETE),
        operator=(SELECT, INSERT, UPDATE, DELETE),
        reader=(SELECT,),
        why="staging and promotion record letters, GC deletes orphans'; requeue, abort and"
        " reset mark them",
    ),
    Grant(
        "twophase_dead_letters_id_seq",
        SEQUENCE,
        executor=(USAGE,),
        driver=(USAGE,),
        operator=(USAGE,),
        why="the ids of new dead letters",
    ),
    Grant(
        "twophase_epoch_events",
        TABLE,
        driver=(SELECT, INSERT, DELETE),
        operator=(SELECT, INSERT, DELETE),
        reader=(SELECT,),
        why="every step appends to the history, GC's compaction deletes old epochs'; a resync"
        " reads back the epochs it skipped",
    ),
    Grant(
        "twophase_epoch_events_id_seq",
        SEQUENCE,
        driver=(USAGE,),
        operator=(USAGE,),
        why="the ids of new events",
    ),
    Grant(
        "twophase_targets",
        TABLE,
        driver=(SELECT, INSERT, UPDATE),
        operator=(SELECT, UPDATE, DELETE),  # its commands never register a target
        reader=(SELECT,),
        why="a query's run registers the targets; deliveries, catch-up, GC and a resync move"
        " their state; a reset and `targets remove` delete",
    ),
    Grant(
        "twophase_target_deliveries",
        TABLE,
        driver=(SELECT, INSERT, DELETE),
        operator=(SELECT, INSERT, DELETE),
        reader=(SELECT,),
        why="each delivery is recorded; GC's compaction, a reset, a resync from an epoch and"
        " `targets remove` delete",
    ),
    Grant(
        "twophase_target_backlog",
        VIEW,
        driver=(SELECT,),
        operator=(SELECT,),
        reader=(SELECT,),
        why="what each target lacks: promotion, catch-up, GC, the exporter",
    ),
)

BY_OBJECT: dict[str, Grant] = {g.name: g for g in GRANTS}


@dataclass(frozen=True)
class RoleNames:
    """The PostgreSQL role each kind of process runs as (None: not granted now). One
    role may serve several kinds; it then gets the union of their grants."""

    executor: str | None = None
    driver: str | None = None
    operator: str | None = None
    reader: str | None = None

    def given(self) -> list[tuple[str, str]]:
        """(kind, role) of each role named, in ``ROLES`` order; UsageError when none is."""
        named = [(kind, getattr(self, kind)) for kind in ROLES if getattr(self, kind)]
        if not named:
            raise UsageError("name a role to grant to: --executor, --driver, --operator, --reader")
        return named


@dataclass(frozen=True)
class _Statement:
    role: str
    on_schema: bool  # USAGE on the schema (every role's first)
    sql: sql.Composed


def statements(roles: RoleNames, schema: str = DEFAULT_SCHEMA) -> list[sql.Composed]:
    """The GRANTs that give each named role what its kind needs in ``schema``: USAGE on
    the schema, then each object's privileges, in ``GRANTS`` order."""
    return [statement.sql for statement in _statements(roles, schema)]


def _statements(roles: RoleNames, schema: str) -> Iterator[_Statement]:
    for kind, role in roles.given():
        yield _Statement(role, True, _grant((USAGE,), "SCHEMA", sql.Identifier(schema), role))
        for grant in GRANTS:
            privileges = grant.privileges(kind)
            if privileges:
                target = sql.Identifier(schema, grant.name)
                yield _Statement(role, False, _grant(privileges, _ON[grant.kind], target, role))


_ON = {TABLE: "TABLE", VIEW: "TABLE", SEQUENCE: "SEQUENCE"}


def _grant(privileges: tuple[str, ...], on: str, target: sql.Composable, role: str) -> sql.Composed:
    return sql.SQL("GRANT {privileges} ON {on} {target} TO {role}").format(
        privileges=sql.SQL(", ").join(sql.SQL(p) for p in privileges),
        on=sql.SQL(on),
        target=target,
        role=sql.Identifier(role),
    )


def apply(db: Database, roles: RoleNames) -> tuple[str, list[str]]:
    """Run the GRANTs in the schema that holds the store, in one transaction, as the
    role of ``db`` (the schema's owner); returns the schema and the statements run.

    UsageError names a role that does not exist; PermanentError says when the
    connected role cannot grant (it does not own the objects; PostgreSQL would only
    warn, or refuse), and nothing is granted. A role that may use the schema already
    (PostgreSQL lets every role use ``public``) gets no grant on it.
    """
    refused: list[str] = []

    def notice(diagnostic: psycopg.errors.Diagnostic) -> None:
        if diagnostic.sqlstate == _NOT_GRANTED:
            refused.append(diagnostic.message_primary or "")

    with db.connection() as conn:
        conn.add_notice_handler(notice)
        try:
            return _apply(conn, roles, refused)
        finally:
            conn.remove_notice_handler(notice)


def _apply(
    conn: psycopg.Connection[Any], roles: RoleNames, refused: list[str]
) -> tuple[str, list[str]]:
    with conn.transaction(), conn.cursor() as cur:
        schema = _schema_of_store(cur)
        _require_roles(cur, [role for _, role in roles.given()])
        _require_owner(cur, schema)
        done = []
        for statement in _statements(roles, schema):
            if statement.on_schema and _may_use(cur, statement.role, schema):
                continue
            cur.execute(statement.sql)
            done.append(statement.sql.as_string(conn))
            if refused:
                raise _not_owner(cur, refused[0])
        return schema, done


def _require_owner(cur: psycopg.Cursor[Any], schema: str) -> None:
    """PermanentError unless the connected role owns (or is a member of the owner of)
    every object to grant on: another role's GRANT would grant nothing, or fail."""
    cur.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = ANY(%s)"
        " AND NOT pg_has_role(c.relowner, 'USAGE') ORDER BY c.relname",
        (schema, list(BY_OBJECT)),
    )
    others = [row[0] for row in cur.fetchall()]
    if others:
        raise _not_owner(cur, f"it does not own {', '.join(others)}")


def _not_owner(cur: psycopg.Cursor[Any], why: str) -> PermanentError:
    cur.execute("SELECT current_user")
    row = cur.fetchone()
    user = row[0] if row else "?"
    return PermanentError(
        f"role {user!r} cannot grant ({why}): run `twophase db grants --apply` as the role"
        " that owns the staging schema (the one that ran `twophase db upgrade`); nothing"
        " was granted"
    )


def _schema_of_store(cur: psycopg.Cursor[Any]) -> str:
    cur.execute(
        "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE c.oid = to_regclass(%s)",
        (VERSION_TABLE,),
    )
    row = cur.fetchone()
    if row is None:  # Database checked the revision: only a race with a downgrade
        raise PermanentError(f"the staging store has no {VERSION_TABLE}")
    return str(row[0])


def _require_roles(cur: psycopg.Cursor[Any], roles: list[str]) -> None:
    cur.execute(
        "SELECT r FROM unnest(%s::text[]) AS r"
        " WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) ORDER BY r",
        (roles,),
    )
    missing = [row[0] for row in cur.fetchall()]
    if missing:
        raise UsageError(
            f"no such role: {', '.join(missing)} (create it first, e.g. CREATE ROLE ... LOGIN)"
        )


def _may_use(cur: psycopg.Cursor[Any], role: str, schema: str) -> bool:
    cur.execute("SELECT has_schema_privilege(%s, %s, 'USAGE')", (role, schema))
    row = cur.fetchone()
    return bool(row and row[0])
