"""Compaction of a sink's epoch history by GC: old records go, the floor stays, and what
the records were for still holds: a replay of a compacted epoch is skipped (I4), a reset
checkpoint is refused (I6), targets, dead letters and pending epochs keep theirs."""

from __future__ import annotations

import uuid

import pytest

from tests.integration.cli_helpers import BAD_POINT, make_cli, make_idle, records, sql
from tests.staging import M, lines, scalar, stage
from tests.support import begin_run, influx_rows
from twophase.config import TargetConfig
from twophase.errors import CheckpointResetError
from twophase.model import EpochState
from twophase.protocol.commit.runtime import TwoPhase
from twophase.protocol.maintain.gc import GarbageCollector
from twophase.store.views import Views

# Seconds ahead of the database's clock: past retention (7 days) and history_retention
# (30 days): every ended epoch's points and record may go.
LATER = 31 * 86400
FLOOR = "SELECT compacted_through FROM twophase_sinks WHERE sink_id = %s"


def test_a_replay_of_a_compacted_epoch_is_skipped_and_a_reset_checkpoint_refused(
    tp: TwoPhase, staging_url: str
) -> None:
    lease = begin_run(tp, "s", "r1", "q1")
    for epoch in range(6):
        tp.committer.commit(lease, epoch, stage(tp, "s", epoch, [lines(epoch, 5)]))
    report = tp.gc.collect("s", ahead_s=LATER)
    # The last COMMITTED epoch keeps its record: a target added later starts after it.
    assert (report.epochs_purged, report.epochs_compacted, report.compacted_through) == (6, 5, 4)
    assert scalar(staging_url, FLOOR, "s") == 4
    assert records(staging_url) == {"epochs": [5], "writes": [5], "events": [5], "deliveries": [5]}
    before = influx_rows(tp.config.target, M)

    # I4: a restart from an old checkpoint replays a compacted epoch with other content.
    lease2 = begin_run(tp, "s", "r2", "q1")
    replay = stage(tp, "s", 2, [lines(2, 7, value_offset=100)], run="r2")
    outcome = tp.committer.commit(lease2, 2, replay)
    assert (outcome.state, outcome.replay, outcome.promoted) == (EpochState.COMMITTED, True, None)
    assert influx_rows(tp.config.target, M) == before
    assert scalar(staging_url, "SELECT replays_detected FROM twophase_sinks") == 1
    ids = [uuid.UUID(m.write_id) for m in replay]
    replayed = "SELECT count(*) FROM twophase_writes WHERE write_id = ANY(%s)"
    assert scalar(staging_url, replayed, ids) == 0  # the replay's writes are discarded
    detail = scalar(
        staging_url, "SELECT detail FROM twophase_epoch_events WHERE event = 'replay_detected'"
    )
    assert detail == "epoch was COMMITTED (compacted, up to 4)"

    # I6: a reset checkpoint (a new query id) is refused, the floor notwithstanding.
    with pytest.raises(CheckpointResetError, match="twophase reset --sink s"):
        begin_run(tp, "s", "r3", "q2")
    assert tp.committer.commit(lease2, 6, stage(tp, "s", 6, [lines(6, 5)], run="r2")).promoted

    # A reset clears the floor with the epochs: the next query's epoch 0 is new.
    tp.ledger.reset("s")
    assert scalar(staging_url, FLOOR, "s") is None
    lease3 = begin_run(tp, "s", "r3", "q2")
    fresh = tp.committer.commit(lease3, 0, stage(tp, "s", 0, [lines(0, 2, host="b")], run="r3"))
    assert (fresh.state, fresh.replay) == (EpochState.COMMITTED, False)


def test_the_floor_waits_for_targets_and_pending_epochs_and_letters_keep_their_epoch(
    tp: TwoPhase, staging_url: str
) -> None:
    lease = begin_run(tp, "s", "r1", "q1")
    for epoch in range(4):
        bad = [BAD_POINT] if epoch == 1 else []  # InfluxDB refuses it: a dead letter
        tp.committer.commit(lease, epoch, stage(tp, "s", epoch, [lines(epoch, 3) + bad]))
    tp.ledger.decide(lease, 4, stage(tp, "s", 4, [lines(4, 3)]))  # PRECOMMITTED

    purge = GarbageCollector(tp.db, 7 * 86400, 3600)  # no history_s: purges, compacts nothing
    assert purge.collect("s", ahead_s=LATER).epochs_purged == 4
    dry = tp.gc.collect("s", dry_run=True, ahead_s=LATER)  # counts what is purged already
    assert (dry.epochs_compacted, dry.compacted_through) == (2, 2)
    assert scalar(staging_url, FLOOR, "s") is None
    done = tp.gc.collect("s", ahead_s=LATER)
    # 3 is the last COMMITTED one; 1 keeps its record for its dead letter; the floor passes it.
    assert (done.epochs_compacted, done.compacted_through) == (2, 2)
    assert records(staging_url)["epochs"] == [1, 3, 4]
    assert Views(tp.db).count_dead_letters("s", None) == 1

    tp.committer.recover(lease)
    tp.committer.commit(lease, 5, stage(tp, "s", 5, [lines(5, 3)]))
    # The target lacks 4 and 5 (a lagging one): the floor stays below what it lacks.
    sql(staging_url, "UPDATE twophase_targets SET delivered_epoch = 3 WHERE sink_id = 's'")
    held = tp.gc.collect("s", ahead_s=LATER)
    assert (held.epochs_compacted, held.compacted_through) == (1, 3)
    assert records(staging_url)["epochs"] == [1, 4, 5]


def test_status_and_epochs_say_how_far_the_history_was_compacted(
    tp: TwoPhase, staging_url: str, influx: TargetConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    lease = begin_run(tp, "s", "r1", "q1")
    for epoch in range(4):
        tp.committer.commit(lease, epoch, stage(tp, "s", epoch, [lines(epoch, 2)]))
    cli = make_cli(staging_url, influx)
    monkeypatch.setenv("TWOPHASE_HISTORY_RETENTION", "0s")
    gc = cli("gc", "--sink", "s", "--retention", "0s", "--yes")
    assert gc.code == 0, gc.err
    assert "compacted the records of 3 delivered epochs" in gc.out
    said = "older epochs were compacted, up to 2"
    status = cli("status", "--sink", "s")
    assert f"sink 's': {said}" in status.out
    assert cli("status", "--sink", "s", "--json").json()["sinks"][0]["compacted_through"] == 2
    assert said in cli("epochs", "--sink", "s").out
    assert cli("epochs", "--sink", "s", "--json").json()["compacted_through"] == 2
    gone = cli("epochs", "--sink", "s", "--epoch", "1")
    assert gone.code != 0
    assert "the records of epochs up to 2 were compacted by gc" in gone.err
    make_idle(staging_url)  # the query's driver is gone
    resync = cli("targets", "resync", "default", "--sink", "s", "--from-epoch", "0", "--yes")
    assert resync.code == 0, resync.err
    assert "NOT supplied: the epochs up to 2 whose records GC compacted" in resync.out
