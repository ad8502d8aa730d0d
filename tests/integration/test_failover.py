"""PostgreSQL failover under a running sink: the primary is killed mid-run and its
standby promoted; twophase, given both hosts with ``target_session_attrs=read-write``,
carries on. With synchronous replication the result is exact and nothing decided is
forgotten; with asynchronous replication a decided epoch can be forgotten, and what
twophase then does is shown (and documented in the README)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.integration.replication import Primary, Standby, failover_url, make_pair
from tests.staging import M, in_thread, lines, stage, wait_for
from tests.support import (
    admin_conninfo,
    alembic,
    begin_run,
    influx_count,
    influx_rows,
    two_phase,
    unique,
)
from twophase.config import StagingConfig, TargetConfig, load_staging_config
from twophase.model import EpochState

SINK = "failover"
EPOCHS = 40
POINTS = 60  # per epoch: two writes of 30


@pytest.fixture
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Primary, Standby]]:
    primary, standby = make_pair(tmp_path, synchronous=request.param == "sync")
    yield primary, standby
    standby.destroy()
    primary.destroy()


def staging_on(pair: tuple[Primary, Standby]) -> tuple[StagingConfig, str]:
    """A migrated database on the primary; the config naming both hosts, and the URL
    of the standby alone (to read what the promoted store holds)."""
    primary, standby = pair
    name = unique("failover")
    primary.create_database(name)
    assert alembic("upgrade", "head", url=primary.url_for(name)).returncode == 0
    config = load_staging_config(
        env={},
        staging_url=failover_url(primary, standby, name),
        staging_connect_timeout="2s",
        staging_retry_deadline="90s",
    )
    return config, standby.url_for(name)


def epoch_states(url: str) -> list[tuple[int, str, int]]:
    with psycopg.connect(admin_conninfo(url)) as conn:
        return conn.execute(
            "SELECT epoch, state, replays FROM twophase_epochs WHERE sink_id = %s ORDER BY epoch",
            (SINK,),
        ).fetchall()


def epoch_lines(epoch: int, offset: float = 0.0) -> list[list[str]]:
    return [lines(epoch, 30, offset), lines(epoch, 30, offset, host="b")]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("pair", ["sync"], indirect=True)
def test_failover_with_synchronous_replication_is_exact(
    pair: tuple[Primary, Standby], influx: TargetConfig
) -> None:
    primary, standby = pair
    config, promoted_url = staging_on(pair)
    done: list[int] = []
    with two_phase(config, influx) as tp:
        lease = begin_run(tp, SINK, "r1", "q1")

        def run() -> None:
            for epoch in range(EPOCHS):
                # No re-run of a failed staging here: the stager repeats a COPY the failover
                # cuts by itself, from its spool, under the same write id.
                tp.committer.commit(lease, epoch, stage(tp, SINK, epoch, epoch_lines(epoch)))
                done.append(epoch)

        thread, box = in_thread(run)
        wait_for(lambda: len(done) >= 5)
        at_failover = len(done)
        primary.kill()  # a crash-like stop: nothing flushed to its clients afterwards
        standby.promote()
        thread.join(300)
        assert "error" not in box, box.get("error")
        assert at_failover < EPOCHS and len(done) == EPOCHS  # epochs went on after it
        # Nothing decided was forgotten: a replay is still detected, its new values unused.
        before = influx_rows(influx, M)
        again = tp.committer.commit(lease, 3, stage(tp, SINK, 3, epoch_lines(3, offset=0.5)))
        assert (again.state, again.replay) == (EpochState.COMMITTED, True)
        assert influx_rows(influx, M) == before
    assert influx_count(influx, M) == EPOCHS * POINTS
    states = epoch_states(promoted_url)
    assert [(e, s) for e, s, _ in states] == [(e, "COMMITTED") for e in range(EPOCHS)]
    assert [r for _, _, r in states] == [0, 0, 0, 1] + [0] * (EPOCHS - 4)


def caught_up(primary: Primary, standby: Standby) -> bool:
    (current,) = primary.admin("SELECT pg_current_wal_lsn()")[0]
    with psycopg.connect(admin_conninfo(standby.url_for("postgres"))) as conn:
        row = conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (current,)).fetchone()
    return bool(row and row[0])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("pair", ["async"], indirect=True)
def test_asynchronous_replication_can_forget_a_decided_epoch(
    pair: tuple[Primary, Standby], influx: TargetConfig
) -> None:
    """What async replication loses: a commit the primary acknowledged before its
    standby had it. Here the standby is held back while epoch 1 commits; after the
    failover the store has never heard of epoch 1, though its points are in InfluxDB.
    A replay of epoch 1 is then decided anew (not detected), and its new values
    replace the delivered ones: first-decided-wins (I1/I4) did not survive."""
    primary, standby = pair
    config, promoted_url = staging_on(pair)
    with two_phase(config, influx) as tp:
        lease = begin_run(tp, SINK, "r1", "q1")
        tp.committer.commit(lease, 0, stage(tp, SINK, 0, epoch_lines(0)))
        wait_for(lambda: caught_up(primary, standby))
        standby.stop()  # falls behind: what the primary acknowledges now is on it alone
        first = tp.committer.commit(lease, 1, stage(tp, SINK, 1, epoch_lines(1)))
        assert first.state == EpochState.COMMITTED
        delivered = influx_rows(influx, M)
        primary.kill()
        standby.start()
        standby.promote()
        assert [(e, s) for e, s, _ in epoch_states(promoted_url)] == [(0, "COMMITTED")]
        replay = tp.committer.commit(lease, 1, stage(tp, SINK, 1, epoch_lines(1, offset=0.5)))
        assert (replay.state, replay.replay) == (EpochState.COMMITTED, False)
    assert influx_count(influx, M) == 2 * POINTS  # same keys: overwritten, not doubled
    assert influx_rows(influx, M) != delivered  # but with the replay's values
