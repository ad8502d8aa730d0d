"""The staging schema is owned by Alembic, and the code refuses a database that is behind;
``twophase db`` migrates it up and down, lists the revisions and prints their SQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support import REPO, admin_conninfo, alembic, create_database, drop_database, unique
from tests.support import staging_config_for as config_for
from twophase.errors import SchemaError, StagingUnavailableError
from twophase.store.database import SCHEMA_REVISION, Database

REVISIONS = [
    "0001_initial",
    "0002_staged_chunks",
    "0003_run_ends",
    "0004_sink_counters",
    "0005_chunk_lanes",
    "0006_kept_dead_letters",
    "0007_targets",
    "0008_compressed_chunks",
    "0009_every_sink_has_targets",
    "0010_compacted_history",
    "0011_generations",
    "0012_chunk_checksums",
]


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
        storage = dict(
            conn.execute(
                "SELECT attname, (attcompression, attstorage) FROM pg_attribute"
                " WHERE attrelid = 'twophase_staged_chunks'::regclass"
                " AND attname IN ('body', 'body_gz')"
            ).fetchall()
        )
    assert storage["body"] == ("l", "x")  # lz4 (this PostgreSQL 15 has it), out of line
    assert storage["body_gz"] == ("", "e")  # gzip already: out of line, not compressed again
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


def twophase(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The installed console script on the store at ``url``; stdin is not a terminal."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TWOPHASE_")}
    return subprocess.run(
        [str(Path(sys.executable).with_name("twophase")), *args],
        env=env | {"TWOPHASE_STAGING_URL": url},
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def revision(url: str) -> str | None:
    return json.loads(twophase(url, "db", "current", "--json").stdout)["after"]


def test_db_upgrade_sql_prints_the_ddl_and_touches_nothing(empty_db: str) -> None:
    done = twophase(empty_db, "db", "upgrade", "--sql")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("BEGIN;") and done.stdout.rstrip().endswith("COMMIT;")
    for table in ("twophase_sinks", "twophase_epochs", "twophase_staged_chunks"):
        assert f"CREATE TABLE {table} (" in done.stdout
    assert "INSERT INTO twophase_alembic_version (version_num) VALUES ('0001_initial')" in (
        done.stdout
    )
    assert tables(empty_db) == set()
    assert revision(empty_db) is None


def test_db_history_marks_the_head_and_the_current_revision(empty_db: str) -> None:
    before = json.loads(twophase(empty_db, "db", "history", "--json").stdout)
    assert [r["revision"] for r in before["revisions"]] == REVISIONS  # oldest first
    assert (before["current"], before["head"]) == (None, SCHEMA_REVISION)
    assert [r["revision"] for r in before["revisions"] if r["head"]] == [SCHEMA_REVISION]
    assert not [r for r in before["revisions"] if r["current"]]

    assert twophase(empty_db, "db", "upgrade", "--revision", "0003_run_ends").returncode == 0
    listing = twophase(empty_db, "db", "history")
    assert listing.returncode == 0, listing.stderr
    rows = {line.split()[0]: line for line in listing.stdout.splitlines()[1:-1]}
    assert list(rows) == REVISIONS
    assert rows["0003_run_ends"].endswith("(current)")
    assert rows[SCHEMA_REVISION].endswith("(head)")
    assert listing.stdout.splitlines()[-1].endswith(
        f"0003_run_ends (this twophase needs {SCHEMA_REVISION}: `twophase db upgrade`)"
    )
    assert ":twophase@" not in listing.stdout  # the password masked in the URL shown


def test_db_downgrade_and_upgrade_back(empty_db: str) -> None:
    assert twophase(empty_db, "db", "upgrade").returncode == 0
    refused = twophase(empty_db, "db", "downgrade", "0004_sink_counters")
    assert refused.returncode == 2
    assert refused.stderr == (
        "twophase: error: db downgrade is destructive and stdin is not a terminal: "
        "pass --yes to confirm\n"
    )
    assert revision(empty_db) == SCHEMA_REVISION

    down = twophase(empty_db, "db", "downgrade", "0004_sink_counters", "--yes", "--json")
    assert down.returncode == 0, down.stderr
    report = json.loads(down.stdout)
    assert (report["before"], report["after"], report["at_head"]) == (
        SCHEMA_REVISION,
        "0004_sink_counters",
        False,
    )
    with psycopg.connect(admin_conninfo(empty_db)) as conn:
        lanes = conn.execute(
            "SELECT count(*) FROM information_schema.columns"
            " WHERE table_name = 'twophase_staged_chunks' AND column_name = 'lane'"
        ).fetchone()
    assert lanes == (0,)
    with pytest.raises(SchemaError, match="0004_sink_counters"):
        Database(config_for(empty_db))  # the code refuses the store until it is upgraded

    again = twophase(empty_db, "db", "downgrade", "0004", "--yes")
    assert again.returncode == 0 and "0004_sink_counters (this twophase needs" in again.stdout
    up = twophase(empty_db, "db", "downgrade", SCHEMA_REVISION, "--yes")
    assert up.returncode == 2 and "cannot downgrade from 0004_sink_counters" in up.stderr
    back = twophase(empty_db, "db", "upgrade")
    assert back.returncode == 0, back.stderr
    assert f"0004_sink_counters -> {SCHEMA_REVISION}" in back.stdout
    Database(config_for(empty_db)).close()  # at head: accepted

    gone = twophase(empty_db, "db", "downgrade", "base", "--yes")
    assert gone.returncode == 0, gone.stderr
    assert tables(empty_db) <= {"twophase_alembic_version"} and revision(empty_db) is None
