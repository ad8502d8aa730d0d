"""Alembic environment for the twophase staging schema (generic, online and offline).

The database URL comes from ``TWOPHASE_STAGING_URL`` (or ``-x url=...``), never
from alembic.ini; offline (``--sql``) none is needed: the SQL is printed for
PostgreSQL without connecting. Only ``twophase_*`` tables are compared by
autogenerate, so the staging schema can live in a database that holds other tables.
"""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import engine_from_config, pool

from twophase.config import load_staging_config
from twophase.store.schema import TABLE_PREFIX, VERSION_TABLE, metadata

config = context.config


def _url() -> str:
    explicit = context.get_x_argument(as_dictionary=True).get("url")
    return load_staging_config(staging_url=explicit).sqlalchemy_url()


def _include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    if type_ == "table":
        return bool(name and name.startswith(TABLE_PREFIX) and name != VERSION_TABLE)
    return True


_OPTIONS: dict[str, Any] = {
    "target_metadata": metadata,
    "version_table": VERSION_TABLE,
    "include_object": _include_object,
    "compare_type": True,
}


def run_migrations_offline() -> None:
    # The staging store is always PostgreSQL, and the dialect is all the SQL depends on:
    # a DBA can print it away from the database, without its URL or password.
    context.configure(dialect_name="postgresql", literal_binds=True, **_OPTIONS)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    section = config.get_section(config.config_ini_section, {})
    section["sqlalchemy.url"] = _url()
    engine = engine_from_config(section, prefix="sqlalchemy.", poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, **_OPTIONS)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
