"""The staging schema is owned by Alembic, and the code refuses a database that is behind."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.support import admin_conninfo, alembic, create_database, drop_database, unique
from tests.support import staging_config_for as config_for
from twophase.errors import SchemaError, StagingUnavailableError
from twophase.store.database import Database


@pytest.fixture
def empty_db(base_staging_url: str) -> Iterator[str]:
    name = unique("twophase_empty")
    yield create_database(base_staging_url, name)
    drop_database(base_staging_url, name)


def tables(url: str) -> set[str]:
    with psycopg.connect(admin_conninfo(url)) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        return {r[0] for r in rows}


def test_upgrade_check_downgrade(empty_db: str) -> None:
    up = alembic("upgrade", "head", url=empty_db)
    assert up.returncode == 0, up.stderr
    assert {
        "twophase_sinks",
        "twophase_runs",
        "twophase_epochs",
        "twophase_writes",
        "twophase_staged_chunks",
        "twophase_dead_letters",
        "twophase_epoch_events",
    } <= tables(empty_db)
    with psycopg.connect(admin_conninfo(empty_db)) as conn:
        body = conn.execute(
            "SELECT attcompression, attstorage FROM pg_attribute"
            " WHERE attrelid = 'twophase_staged_chunks'::regclass AND attname = 'body'"
        ).fetchone()
    assert body == ("l", "x")  # lz4 (this PostgreSQL 15 has it), out of line
    check = alembic("check", url=empty_db)  # metadata is the single source: no diff
    assert check.returncode == 0, check.stdout + check.stderr
    assert "No new upgrade operations detected" in check.stdout + check.stderr
    Database(config_for(empty_db)).close()  # at head: accepted

    down = alembic("downgrade", "base", url=empty_db)
    assert down.returncode == 0, down.stderr
    assert tables(empty_db) <= {"twophase_alembic_version"}


def test_missing_schema_fails_fast_with_the_fix(empty_db: str) -> None:
    with pytest.raises(SchemaError, match="alembic upgrade head") as info:
        Database(config_for(empty_db))
    assert ":twophase@" not in str(info.value)  # password masked in the URL shown


def test_schema_behind_fails_fast(empty_db: str) -> None:
    assert alembic("upgrade", "head", url=empty_db).returncode == 0
    with psycopg.connect(admin_conninfo(empty_db)) as conn:
        conn.execute("UPDATE twophase_alembic_version SET version_num = '0000_older'")
    with pytest.raises(SchemaError, match=r"'0000_older'.*alembic upgrade head"):
        Database(config_for(empty_db))


def test_alembic_names_the_missing_variable() -> None:
    done = alembic("upgrade", "head", url="")
    assert done.returncode != 0
    assert "TWOPHASE_STAGING_URL" in done.stderr


def test_unreachable_database_is_retryable_and_masks_password() -> None:
    url = "postgresql+psycopg://u:sekrit@127.0.0.1:1/nodb"
    with pytest.raises(StagingUnavailableError) as info:
        Database(config_for(url, staging_connect_timeout="1s"))
    assert "sekrit" not in str(info.value)
