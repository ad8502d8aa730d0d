"""The staging schema from an installed twophase: the Alembic migrations shipped in the
package, run without the source tree.

Like alembic's ``command`` module, one plain function per command:
[`current_schema`][twophase.operations.migrate.current_schema],
[`upgrade_schema`][twophase.operations.migrate.upgrade_schema],
[`downgrade_schema`][twophase.operations.migrate.downgrade_schema],
[`schema_history`][twophase.operations.migrate.schema_history], and, for a DBA who runs the SQL by
hand, [`upgrade_sql`][twophase.operations.migrate.upgrade_sql]
and [`downgrade_sql`][twophase.operations.migrate.downgrade_sql] (offline: the database is not
touched, and not even needed).
A revision is named by its id (``0004_sink_counters``), a unique prefix of it
(``0004``), ``head`` or ``base`` (no schema). Alembic's refusals of a revision are
``UsageError``.
"""

from __future__ import annotations

import argparse
import io
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

from twophase.config import StagingConfig
from twophase.errors import UsageError
from twophase.operations.hooks import SILENT, Hooks
from twophase.store.database import SCHEMA_REVISION, Database

# The top-level ``migrations/`` of the checkout, installed as ``twophase.migrations``.
MIGRATIONS = files("twophase.migrations")


@dataclass(frozen=True)
class SchemaReport:
    """The store's revision before and after (None: no twophase schema), and the head
    this twophase needs."""

    url: str
    before: str | None
    after: str | None
    head: str = SCHEMA_REVISION

    @property
    def at_head(self) -> bool:
        return self.after == self.head


@dataclass(frozen=True)
class SchemaRevision:
    """One revision the package ships: its id, the one it follows, what it does."""

    revision: str
    down_revision: str | None
    description: str
    head: bool
    current: bool


@dataclass(frozen=True)
class SchemaHistory:
    """The shipped revisions, oldest first, and where the store is among them."""

    url: str
    current: str | None
    head: str
    revisions: tuple[SchemaRevision, ...]


@dataclass(frozen=True)
class SchemaSql:
    """The SQL a migration from ``start`` to ``target`` runs (None: no schema), printed
    instead of run: BEGIN, the statements, the version table's update, COMMIT."""

    action: str
    start: str | None
    target: str | None
    sql: str


def current_schema(config: StagingConfig) -> SchemaReport:
    """Where the store's schema is, changing nothing."""
    revision = _revision(config)
    return SchemaReport(config.display_url, revision, revision)


def upgrade_schema(config: StagingConfig, revision: str = "head") -> SchemaReport:
    """Migrate the store to ``revision`` (default the head) with the shipped migrations.

    Idempotent at the head. Stop every twophase job first, as for any migration.
    """
    from alembic import command

    before = _revision(config)
    with _alembic_errors():
        command.upgrade(_online(config), revision)
    return SchemaReport(config.display_url, before, _revision(config))


def downgrade_schema(config: StagingConfig, revision: str, hooks: Hooks = SILENT) -> SchemaReport:
    """Migrate the store down to ``revision`` (``base``: remove the schema), after
    ``hooks.confirm``: what the later revisions added is dropped, with its data.

    Nothing to do (and nothing asked) when the store is at ``revision`` already; a
    revision that is not below the store's is a ``UsageError``. Stop every twophase
    job first: none of them accepts the store until it is upgraded again.
    """
    from alembic import command

    before = _revision(config)
    with _alembic_errors():
        script = _script()
        target = _resolve(script, revision)
        if target == before:
            return SchemaReport(config.display_url, before, before)
        _require_direction(script, before, target, "downgrade")
        hooks.confirm(
            f"Downgrade the staging schema of {config.display_url} from {before} to "
            f"{target or 'no schema'}? What the later revisions added is dropped, with its "
            f"data, and no twophase job accepts the store until `twophase db upgrade`."
        )
        command.downgrade(_online(config), target or "base")
    return SchemaReport(config.display_url, before, _revision(config))


def schema_history(config: StagingConfig) -> SchemaHistory:
    """The revisions this twophase ships, marking the head and the store's current one."""
    current = _revision(config)
    revisions = [
        SchemaRevision(
            revision=s.revision,
            down_revision=_parent(s.down_revision),
            description=s.doc,
            head=s.is_head,
            current=s.revision == current,
        )
        for s in _script().walk_revisions()  # newest first
    ]
    (head,) = [r.revision for r in revisions if r.head]
    return SchemaHistory(config.display_url, current, head, tuple(reversed(revisions)))


def upgrade_sql(revision: str = "head") -> SchemaSql:
    """The SQL of an upgrade to ``revision``, from no schema, or ``FROM:TO``."""
    return _migration_sql("upgrade", revision, default_start="base")


def downgrade_sql(revision: str) -> SchemaSql:
    """The SQL of a downgrade to ``revision`` from the head, or ``FROM:TO``.

    Offline, Alembic cannot ask the store where it is: the start is the head unless
    given.
    """
    return _migration_sql("downgrade", revision, default_start="head")


def _migration_sql(action: str, revision: str, default_start: str) -> SchemaSql:
    """Alembic's offline ``upgrade``/``downgrade`` of ``[FROM:]TO``, checked for direction."""
    from alembic import command

    start_spec, _, target_spec = revision.rpartition(":")
    run = getattr(command, action)
    with _alembic_errors():
        script = _script()
        start = _resolve(script, start_spec or default_start)
        target = _resolve(script, target_spec)
        _require_direction(script, start, target, action)
        sql = _offline(lambda config: run(config, _span(start, target), sql=True))
    return SchemaSql(action, start, target, sql)


def _revision(config: StagingConfig) -> str | None:
    with Database(config, max_size=1, check_schema=False) as db:
        return db.schema_revision()


def _alembic_config() -> Any:
    from alembic.config import Config

    alembic = Config()
    alembic.set_main_option("script_location", str(MIGRATIONS))
    return alembic


def _online(config: StagingConfig) -> Any:
    alembic = _alembic_config()
    # env.py reads the URL from ``-x url=``: it stays in memory, never in a file or a log.
    alembic.cmd_opts = argparse.Namespace(x=[f"url={config.url.reveal()}"])
    return alembic


def _offline(run: Callable[[Any], None]) -> str:
    """What ``run(config)`` writes in Alembic's offline mode (env.py needs no URL then)."""
    buffer = io.StringIO()
    alembic = _alembic_config()
    alembic.output_buffer = buffer
    alembic.cmd_opts = argparse.Namespace(x=[])
    run(alembic)
    return buffer.getvalue()


def _script() -> Any:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_alembic_config())


def _resolve(script: Any, revision: str) -> str | None:
    """A revision's full id; None for ``base`` (no schema)."""
    if not revision:  # Alembic asserts on an empty name
        raise UsageError("a revision is required (an id, a unique prefix of one, head or base)")
    found = script.get_revision(revision)
    return None if found is None else str(found.revision)


def _at_or_below(script: Any, lower: str | None, upper: str | None) -> bool:
    """Whether ``lower`` is ``upper`` or a revision ``upper`` follows (None: no schema,
    below every revision)."""
    down = upper
    while down != lower and down is not None:
        down = _parent(script.get_revision(down).down_revision)
    return down == lower


def _require_direction(script: Any, start: str | None, target: str | None, action: str) -> None:
    """Alembic prints nothing for a range the wrong way round, or refuses it in its own
    words: say which way a migration goes."""
    lower, upper = (start, target) if action == "upgrade" else (target, start)
    if not _at_or_below(script, lower, upper):
        raise UsageError(f"cannot {action} from {start or 'no schema'} to {target or 'no schema'}")


def _span(start: str | None, target: str | None) -> str:
    return f"{start or 'base'}:{target or 'base'}"


def _parent(down_revision: Any) -> str | None:
    """The revision a revision follows (the shipped history is one line, without merges)."""
    return None if down_revision is None else str(down_revision)


@contextmanager
def _alembic_errors() -> Iterator[None]:
    """Alembic's refusals (an unknown revision, a range it cannot take) as ``UsageError``."""
    from alembic.util import CommandError

    try:
        yield
    except CommandError as exc:
        raise UsageError(str(exc)) from None
