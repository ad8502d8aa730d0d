"""The staging schema from an installed twophase: the Alembic migrations shipped in the
package, run without the source tree (``twophase db upgrade``, ``twophase db current``)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from importlib.resources import files

from twophase.config import StagingConfig
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


def current_schema(config: StagingConfig) -> SchemaReport:
    """Where the store's schema is, changing nothing."""
    revision = _revision(config)
    return SchemaReport(config.display_url, revision, revision)


def upgrade_schema(config: StagingConfig, revision: str = "head") -> SchemaReport:
    """Migrate the store to ``revision`` (default the head) with the shipped migrations.

    Idempotent at the head. Stop every twophase job first, as for any migration.
    """
    from alembic import command
    from alembic.config import Config

    before = _revision(config)
    alembic = Config()
    alembic.set_main_option("script_location", str(MIGRATIONS))
    # env.py reads the URL from ``-x url=``: it stays in memory, never in a file or a log.
    alembic.cmd_opts = argparse.Namespace(x=[f"url={config.url.reveal()}"])
    command.upgrade(alembic, revision)
    return SchemaReport(config.display_url, before, _revision(config))


def _revision(config: StagingConfig) -> str | None:
    with Database(config, max_size=1, check_schema=False) as db:
        return db.schema_revision()
