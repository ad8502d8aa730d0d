"""Migration 0011: a store of 0010 gets the generations, 0 for every sink and target (as
every record a transactional target holds from before reads), a reset under the new
code starts the sink's next one, and the downgrade drops them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.cli_helpers import sql
from tests.support import (
    alembic,
    create_migrated_database,
    drop_database,
    staging_config_for,
    unique,
)
from twophase.operations import Guard, reset

SINKS = "SELECT sink_id, generation FROM twophase_sinks ORDER BY sink_id"
TARGETS = "SELECT sink_id, target, generation FROM twophase_targets ORDER BY sink_id, target"
COLUMNS = (
    "SELECT table_name FROM information_schema.columns WHERE column_name = 'generation'"
    " AND table_name IN ('twophase_sinks', 'twophase_targets')"
)


@pytest.fixture
def db_at_0010(base_staging_url: str) -> Iterator[str]:
    name = unique("twophase_mig")
    yield create_migrated_database(base_staging_url, name, "0010_compacted_history")
    drop_database(base_staging_url, name)


def test_every_sink_and_target_starts_in_generation_0(db_at_0010: str) -> None:
    sql(db_at_0010, "INSERT INTO twophase_sinks (sink_id, last_decided_epoch) VALUES ('old', 3)")
    sql(
        db_at_0010,
        "INSERT INTO twophase_targets (sink_id, target, delivered_epoch) VALUES"
        " ('old', 'default', 3), ('old', 'pg', 3)",
    )
    up = alembic("upgrade", "head", url=db_at_0010)
    assert up.returncode == 0, up.stderr
    assert sql(db_at_0010, SINKS) == [("old", 0)]
    assert sql(db_at_0010, TARGETS) == [("old", "default", 0), ("old", "pg", 0)]

    reset(staging_config_for(db_at_0010), "old", guard=Guard(force=True))
    assert sql(db_at_0010, SINKS) == [("old", 1)]  # the next query's targets start in it

    down = alembic("downgrade", "0010_compacted_history", url=db_at_0010)
    assert down.returncode == 0, down.stderr
    assert sql(db_at_0010, COLUMNS) == []
