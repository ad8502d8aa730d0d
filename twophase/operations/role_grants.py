"""Least privilege as an operation: the GRANTs each role needs, printed or applied.

Like [`twophase.operations.migrate`][twophase.operations.migrate]'s ``--sql``,
[`grant_sql`][twophase.operations.role_grants.grant_sql] needs no database: it writes the
statements for a DBA. [`apply_grants`][twophase.operations.role_grants.apply_grants] runs
them in the store as its owner. The roles must exist: making them, with their
passwords, is the DBA's. What each role may do is
[`twophase.store.least_privilege`][twophase.store.least_privilege]'s table.
"""

from __future__ import annotations

from dataclasses import dataclass

from twophase.config import StagingConfig
from twophase.store import least_privilege
from twophase.store.database import Database
from twophase.store.least_privilege import DEFAULT_SCHEMA, RoleNames

__all__ = ["GrantReport", "GrantSql", "RoleNames", "apply_grants", "grant_sql"]


@dataclass(frozen=True)
class GrantSql:
    """The GRANTs for ``roles`` in ``schema``, one statement a line."""

    schema: str
    roles: RoleNames
    sql: str


@dataclass(frozen=True)
class GrantReport:
    """What ``apply_grants`` ran in the store at ``url``: the schema that holds it and
    each statement (a role that may use the schema already gets no grant on it)."""

    url: str
    schema: str
    roles: RoleNames
    statements: tuple[str, ...]


def grant_sql(roles: RoleNames, schema: str | None = None) -> GrantSql:
    """The GRANTs for ``roles`` in ``schema`` (default ``public``), to run as the staging
    schema's owner; the database is not touched."""
    schema = schema or DEFAULT_SCHEMA
    lines = [f"{statement.as_string()};" for statement in least_privilege.statements(roles, schema)]
    return GrantSql(schema, roles, "\n".join(lines) + "\n")


def apply_grants(config: StagingConfig, roles: RoleNames) -> GrantReport:
    """Grant ``roles`` what their kind needs in the store, in one transaction, connected
    as ``config``'s role, which must own the staging schema.

    Safe to run again: a grant held already changes nothing. Run it after every
    ``twophase db upgrade`` too, since a revision may add a table.
    """
    roles.given()  # none named: UsageError before connecting
    with Database(config, max_size=1) as db:
        schema, done = least_privilege.apply(db, roles)
    return GrantReport(config.display_url, schema, roles, tuple(done))
