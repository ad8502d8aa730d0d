"""Migration 0009: a sink that delivered to one server before targets had cursors gets
its target ``default``, holding its history; the downgrade gives the old layout back."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.integration.cli_helpers import sql
from tests.staging import M, lines, stage
from tests.support import (
    admin_conninfo,
    alembic,
    create_migrated_database,
    drop_database,
    influx_count,
    staging_config_for,
    two_phase,
    unique,
)
from twophase.config import TargetConfig
from twophase.model import EpochState


@pytest.fixture
def db_at_0008(base_staging_url: str) -> Iterator[str]:
    name = unique("twophase_mig")
    yield create_migrated_database(base_staging_url, name, "0008_compressed_chunks")
    drop_database(base_staging_url, name)


def _one_server_history(url: str) -> None:
    """What 0008's code left for a sink with one server: epochs 0 and 1 and correction
    -1 COMMITTED, epoch 2 ABORTED, a promote-time dead letter naming no target, and a
    sink whose targets were named (it keeps its rows)."""
    with psycopg.connect(admin_conninfo(url)) as conn:
        for sink in ("one", "fan"):
            conn.execute(
                "INSERT INTO twophase_sinks (sink_id, query_id, owner_run_id, fencing_token,"
                " last_decided_epoch) VALUES (%s, 'q1', 'r1', 1, 2)",
                (sink,),
            )
        for epoch, state in ((0, "COMMITTED"), (1, "COMMITTED"), (-1, "COMMITTED"), (2, "ABORTED")):
            conn.execute(
                "INSERT INTO twophase_epochs (sink_id, epoch, state, run_id, query_id,"
                " write_ids, checksum, points_staged, points_delivered, committed_at)"
                " VALUES ('one', %s, %s, 'r1', 'q1', '{}', 'x', 0, 0, now())",
                (epoch, state),
            )
        conn.execute(
            "INSERT INTO twophase_dead_letters (sink_id, epoch, write_id, seq, phase, reason,"
            " payload) VALUES ('one', 1, gen_random_uuid(), 0, 'promote', 'refused', 'm v=1 1')"
        )
        conn.execute(
            "INSERT INTO twophase_epochs (sink_id, epoch, state, run_id, query_id, write_ids,"
            " checksum, points_staged, committed_at) VALUES ('fan', 0, 'COMMITTED', 'r1', 'q1',"
            " '{}', 'x', 0, now())"
        )
        for target in ("a", "b"):
            conn.execute(
                "INSERT INTO twophase_targets (sink_id, target, delivered_epoch, from_epoch)"
                " VALUES ('fan', %s, 0, 0)",
                (target,),
            )


def test_a_sink_of_one_server_gets_its_default_target_with_its_history(
    db_at_0008: str, influx: TargetConfig
) -> None:
    _one_server_history(db_at_0008)
    up = alembic("upgrade", "head", url=db_at_0008)
    assert up.returncode == 0, up.stderr
    targets = sql(
        db_at_0008,
        "SELECT sink_id, target, delivered_epoch, from_epoch, state FROM twophase_targets"
        " ORDER BY sink_id, target",
    )
    assert targets == [
        ("fan", "a", 0, 0, "live"),
        ("fan", "b", 0, 0, "live"),
        ("one", "default", 1, 0, "live"),  # holds 0 and 1: they were its deliveries
    ]
    assert sql(db_at_0008, "SELECT sink_id, target, epoch FROM twophase_target_deliveries") == [
        ("one", "default", -1)  # the correction it took
    ]
    assert sql(db_at_0008, "SELECT count(*) FROM twophase_target_backlog") == [(0,)]
    assert sql(db_at_0008, "SELECT target FROM twophase_dead_letters") == [("default",)]

    # The new code goes on from epoch 3 without sending 0 and 1 again.
    with two_phase(staging_config_for(db_at_0008), influx) as tp:
        lease = tp.committer.claim("one", "r2", "q1")
        outcome = tp.committer.commit(lease, 3, stage(tp, "one", 3, [lines(3, 5)]))
        assert outcome.state == EpochState.COMMITTED
    assert influx_count(influx, M) == 5
    assert sql(
        db_at_0008, "SELECT delivered_epoch FROM twophase_targets WHERE sink_id = 'one'"
    ) == [(3,)]

    down = alembic("downgrade", "0008_compressed_chunks", url=db_at_0008)
    assert down.returncode == 0, down.stderr
    assert sql(db_at_0008, "SELECT DISTINCT sink_id FROM twophase_targets") == [("fan",)]
    assert sql(db_at_0008, "SELECT target FROM twophase_dead_letters") == [("",)]
