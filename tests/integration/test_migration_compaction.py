"""Migration 0010: a store of 0009 gets the sinks' compacted floor (nothing compacted yet),
its history is compacted by the new code's GC, and the downgrade drops the floor."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.cli_helpers import sql
from tests.staging import lines, stage
from tests.support import (
    alembic,
    create_migrated_database,
    drop_database,
    staging_config_for,
    two_phase,
    unique,
)
from twophase.config import TargetConfig

FLOOR = "SELECT sink_id, compacted_through FROM twophase_sinks ORDER BY sink_id"


@pytest.fixture
def db_at_0009(base_staging_url: str) -> Iterator[str]:
    name = unique("twophase_mig")
    yield create_migrated_database(base_staging_url, name, "0009_every_sink_has_targets")
    drop_database(base_staging_url, name)


def test_the_floor_is_added_empty_and_dropped_by_the_downgrade(
    db_at_0009: str, influx: TargetConfig
) -> None:
    sql(db_at_0009, "INSERT INTO twophase_sinks (sink_id, last_decided_epoch) VALUES ('old', 7)")
    up = alembic("upgrade", "head", url=db_at_0009)
    assert up.returncode == 0, up.stderr
    assert sql(db_at_0009, FLOOR) == [("old", None)]  # nothing compacted

    with two_phase(staging_config_for(db_at_0009), influx) as tp:
        lease = tp.committer.claim("s", "r1", "q1")
        for epoch in range(3):
            tp.committer.commit(lease, epoch, stage(tp, "s", epoch, [lines(epoch, 2)]))
        assert tp.gc.collect("s", ahead_s=31 * 86400).compacted_through == 1
    assert sql(db_at_0009, FLOOR) == [("old", None), ("s", 1)]

    down = alembic("downgrade", "0009_every_sink_has_targets", url=db_at_0009)
    assert down.returncode == 0, down.stderr
    columns = sql(
        db_at_0009,
        "SELECT column_name FROM information_schema.columns"
        " WHERE table_name = 'twophase_sinks' AND column_name = 'compacted_through'",
    )
    assert columns == []
    assert sql(db_at_0009, "SELECT epoch FROM twophase_epochs WHERE sink_id = 's'") == [(2,)]
