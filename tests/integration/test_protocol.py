"""The epoch state machine and invariants I1-I6, I8 against real PostgreSQL and InfluxDB."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from tests.staging import STAGED_POINTS, M, epoch_row, lines, scalar, stage
from tests.support import admin_conninfo, begin_run, influx_count, influx_rows
from twophase.config import UNCOMPRESSED
from twophase.errors import CheckpointResetError, FencedError, PermanentError, StateError
from twophase.model import EpochState, StagedChunk
from twophase.protocol.commit.runtime import TwoPhase


def test_stage_decide_promote_commit(tp: TwoPhase, staging_url: str) -> None:
    lease = begin_run(tp, "s", "r1", "q1")
    messages = stage(tp, "s", 0, [lines(0, 30)[:10], lines(0, 30)[10:]])
    assert [m.points for m in messages] == [10, 20]
    assert influx_count(tp.config.target, M) == 0  # phase 1 sends nothing

    decision = tp.ledger.decide(lease, 0, messages)
    assert (decision.state, decision.replay, decision.points_staged) == (
        EpochState.PRECOMMITTED,
        False,
        30,
    )
    assert influx_count(tp.config.target, M) == 0  # nor does the vote

    result = tp.promoter.promote(lease, 0)
    assert (result.delivered, result.rejected) == (30, 0)
    assert influx_count(tp.config.target, M) == 30
    row = epoch_row(staging_url, "s", 0)
    assert row | {"attempts": 1} == {
        "state": EpochState.COMMITTED,
        "staged": 30,
        "delivered": 30,
        "rejected_stage": 0,
        "rejected_promote": 0,
        "replays": 0,
        "attempts": 1,
        "writes": 2,
    }
    assert scalar(staging_url, "SELECT last_committed_epoch FROM twophase_sinks") == 0


def test_commit_runs_the_whole_protocol_and_records_history(tp: TwoPhase, staging_url: str) -> None:
    lease = begin_run(tp, "s", "r1", "q1")
    outcome = tp.committer.commit(lease, 0, stage(tp, "s", 0, [lines(0, 5)]))
    assert (outcome.state, outcome.replay, outcome.promoted.delivered) == (
        EpochState.COMMITTED,
        False,
        5,
    )
    events = scalar(
        staging_url, "SELECT string_agg(event, ',' ORDER BY id) FROM twophase_epoch_events"
    )
    assert events == "run_started,target_added,decided,committed"


def test_failed_stage_leaves_nothing(tp: TwoPhase, staging_url: str) -> None:
    def rows_then_failure() -> Any:
        yield from lines(0, 5)
        raise RuntimeError("task died mid-partition")

    with pytest.raises(RuntimeError):
        tp.stager.stage("s", 0, rows_then_failure())
    assert scalar(staging_url, STAGED_POINTS) == 0
    assert scalar(staging_url, "SELECT count(*) FROM twophase_writes") == 0


def test_discard_removes_only_unchosen_writes(tp: TwoPhase, staging_url: str) -> None:
    lease = begin_run(tp, "s", "r1", "q1")
    chosen = stage(tp, "s", 0, [lines(0, 4)])
    failed_attempt = stage(tp, "s", 0, [lines(0, 4)], attempt=1)
    tp.ledger.decide(lease, 0, chosen)
    removed = tp.gc.discard([m.write_id for m in chosen + failed_attempt])
    assert removed == 1
    assert scalar(staging_url, STAGED_POINTS) == 4
    assert tp.gc.discard([m.write_id for m in failed_attempt]) == 0  # idempotent
    tp.promoter.promote(lease, 0)
    assert influx_count(tp.config.target, M) == 4


def test_replay_of_committed_epoch_is_skipped_and_counted(tp: TwoPhase, staging_url: str) -> None:
    """I4: a re-run with different content changes nothing in InfluxDB."""
    lease = begin_run(tp, "s", "r1", "q1")
    tp.committer.commit(lease, 0, stage(tp, "s", 0, [lines(0, 10)]))
    before = influx_rows(tp.config.target, M)

    lease2 = begin_run(tp, "s", "r2", "q1")  # restart from the same checkpoint
    replay = stage(tp, "s", 0, [lines(0, 12, value_offset=100)], run="r2")
    outcome = tp.committer.commit(lease2, 0, replay)
    assert (outcome.state, outcome.replay, outcome.promoted) == (EpochState.COMMITTED, True, None)
    assert influx_rows(tp.config.target, M) == before
    assert epoch_row(staging_url, "s", 0)["replays"] == 1
    assert scalar(staging_url, "SELECT replays_detected FROM twophase_sinks") == 1
    replay_ids = [uuid.UUID(m.write_id) for m in replay]
    assert (
        scalar(
            staging_url, "SELECT count(*) FROM twophase_writes WHERE write_id = ANY(%s)", replay_ids
        )
        == 0
    )


def test_replay_of_precommitted_epoch_completes_from_original_writes(tp: TwoPhase) -> None:
    """I1: once PRECOMMITTED, the point set is the original one, whatever a replay stages."""
    lease = begin_run(tp, "s", "r1", "q1")
    original = lines(0, 10)
    tp.ledger.decide(lease, 0, stage(tp, "s", 0, [original]))  # driver dies before promote

    lease2 = begin_run(tp, "s", "r2", "q1")
    outcome = tp.committer.commit(lease2, 0, stage(tp, "s", 0, [lines(0, 3, 7.5)], run="r2"))
    assert outcome.recovered == (0,)
    assert outcome.replay and outcome.state == EpochState.COMMITTED
    got = influx_rows(tp.config.target, M)
    assert len(got) == 10
    assert sorted(dict(r[2])["v"] for r in got) == [float(i) for i in range(10)]


def test_epochs_are_promoted_in_order(tp: TwoPhase, staging_url: str) -> None:
    """I3: pending epochs are promoted oldest first, before a new epoch."""
    lease = begin_run(tp, "s", "r1", "q1")
    for epoch in (0, 1):
        tp.ledger.decide(lease, epoch, stage(tp, "s", epoch, [lines(epoch, 3)]))
    assert tp.ledger.pending("s") == [0, 1]
    outcome = tp.committer.commit(lease, 2, stage(tp, "s", 2, [lines(2, 3)]))
    assert outcome.recovered == (0, 1)
    order = scalar(
        staging_url,
        "SELECT string_agg(epoch::text, ',' ORDER BY id)"
        " FROM twophase_epoch_events WHERE event = 'committed'",
    )
    assert order == "0,1,2"
    assert tp.ledger.pending("s") == []


def test_newer_run_fences_older_run(tp: TwoPhase, staging_url: str) -> None:
    """I5: a zombie driver can neither decide nor mark, and writes nothing."""
    zombie = begin_run(tp, "s", "r1", "q1")
    tp.ledger.decide(zombie, 0, stage(tp, "s", 0, [lines(0, 3)]))
    fresh = begin_run(tp, "s", "r2", "q1")
    assert fresh.token > zombie.token

    messages = stage(tp, "s", 1, [lines(1, 3)])
    with pytest.raises(FencedError, match="fenced by a newer run"):
        tp.ledger.decide(zombie, 1, messages)
    with pytest.raises(FencedError):
        tp.ledger.mark_committed(zombie, 0, 3, 0)
    with pytest.raises(FencedError):
        tp.promoter.promote(zombie, 0)
    assert influx_count(tp.config.target, M) == 0
    assert scalar(staging_url, "SELECT count(*) FROM twophase_epochs WHERE epoch = 1") == 0
    assert epoch_row(staging_url, "s", 0)["state"] == EpochState.PRECOMMITTED
    tp.committer.recover(fresh)
    assert influx_count(tp.config.target, M) == 3


def test_reset_checkpoint_is_refused_then_allowed_after_reset(tp: TwoPhase) -> None:
    """I6: a new query id restarting at epoch 0 is refused, never taken for replays."""
    lease = begin_run(tp, "s", "r1", "q1")
    for epoch in (0, 1):
        tp.committer.commit(lease, epoch, stage(tp, "s", epoch, [lines(epoch, 2)]))
    with pytest.raises(CheckpointResetError, match=r"twophase reset --sink s"):
        begin_run(tp, "s", "r2", "q2")
    # The refused query did not fence the owner: it keeps working.
    tp.committer.commit(lease, 2, stage(tp, "s", 2, [lines(2, 2)]))

    tp.ledger.reset("s")
    lease2 = begin_run(tp, "s", "r2", "q2")
    outcome = tp.committer.commit(lease2, 0, stage(tp, "s", 0, [lines(0, 2, 50, host="b")]))
    assert (outcome.state, outcome.replay) == (EpochState.COMMITTED, False)


def test_unknown_epoch_below_last_is_refused(tp: TwoPhase) -> None:
    lease = begin_run(tp, "s", "r1", "q1")
    tp.committer.commit(lease, 5, stage(tp, "s", 5, [lines(5, 2)]))
    with pytest.raises(StateError, match="does not match"):
        tp.ledger.decide(lease, 3, stage(tp, "s", 3, [lines(3, 2)]))


def test_decide_refuses_writes_that_are_not_staged(tp: TwoPhase) -> None:
    lease = begin_run(tp, "s", "r1", "q1")
    other_epoch = stage(tp, "s", 1, [lines(1, 2)])
    with pytest.raises(PermanentError, match="not staged"):
        tp.ledger.decide(lease, 0, other_epoch)


def test_operator_abort(tp: TwoPhase, staging_url: str) -> None:
    lease = begin_run(tp, "s", "r1", "q1")
    tp.ledger.decide(lease, 0, stage(tp, "s", 0, [lines(0, 3)]))
    tp.ledger.abort("s", 0, "bad data upstream")
    assert epoch_row(staging_url, "s", 0)["state"] == EpochState.ABORTED
    assert tp.ledger.pending("s") == []
    with pytest.raises(StateError):
        tp.ledger.mark_committed(lease, 0, 3, 0)
    with pytest.raises(StateError):
        tp.ledger.abort("s", 0, "twice")
    # a replay of the aborted epoch is detected and not sent
    outcome = tp.committer.commit(lease, 0, stage(tp, "s", 0, [lines(0, 3)]))
    assert (outcome.state, outcome.replay) == (EpochState.ABORTED, True)
    assert influx_count(tp.config.target, M) == 0


def test_committed_epoch_cannot_be_aborted_and_mark_is_idempotent(tp: TwoPhase) -> None:
    lease = begin_run(tp, "s", "r1", "q1")
    tp.committer.commit(lease, 0, stage(tp, "s", 0, [lines(0, 3)]))
    tp.ledger.mark_committed(lease, 0, 3, 0)  # again: no error
    with pytest.raises(StateError, match="COMMITTED"):
        tp.ledger.abort("s", 0, "too late")


@pytest.mark.parametrize(
    ("tamper", "error"),
    [
        # same length, one character changed: only the checksum can tell
        (
            "UPDATE twophase_staged_chunks SET body = overlay(body placing 'X' from 3 for 1)",
            "changed after the decision",
        ),
        # the same on a chunk staged before chunks had checksums: its write's checksum
        (
            "UPDATE twophase_staged_chunks SET body = overlay(body placing 'X' from 3 for 1),"
            " checksum = NULL",
            "changed after the decision",
        ),
        # the last line dropped, the count lowered to match
        (
            "UPDATE twophase_staged_chunks SET body = left(body, strpos(body, E'\\n')"
            " + strpos(substr(body, strpos(body, E'\\n') + 1), E'\\n') - 1), points = 2",
            "changed after the decision",
        ),
        # the count no longer fits the body
        ("UPDATE twophase_staged_chunks SET body = body || E'\\nm v=1 1'", "damaged"),
    ],
)
@pytest.mark.lanes(1)  # the tampering rewrites a chunk of three lines
@pytest.mark.compression(UNCOMPRESSED)
def test_changed_staged_points_are_detected_before_commit(
    tp: TwoPhase, staging_url: str, tamper: str, error: str
) -> None:
    """I1 is also checked: a tampered point set is refused, the epoch stays PRECOMMITTED."""
    lease = begin_run(tp, "s", "r1", "q1")
    tp.ledger.decide(lease, 0, stage(tp, "s", 0, [lines(0, 3)]))
    with psycopg.connect(admin_conninfo(staging_url)) as conn:
        conn.execute(tamper)
    with pytest.raises(PermanentError, match=error):
        tp.promoter.promote(lease, 0)
    assert epoch_row(staging_url, "s", 0)["state"] == EpochState.PRECOMMITTED


@pytest.mark.parametrize(
    ("tamper", "error"),
    [
        # one byte of the deflate stream changed: its chunk's checksum no longer
        # matches, found before anything of it is sent
        (
            "UPDATE twophase_staged_chunks SET body_gz = overlay(body_gz placing"
            " '\\x00'::bytea from 20 for 1)",
            "changed after the decision",
        ),
        # the same on a chunk staged before chunks had checksums: InfluxDB refuses the
        # stream, and taking the request apart into lines finds the member broken
        (
            "UPDATE twophase_staged_chunks SET body_gz = overlay(body_gz placing"
            " '\\x00'::bytea from 20 for 1), checksum = NULL",
            "damaged: its gzip member does not decompress",
        ),
        # a chunk staged before chunks had checksums, recompressed from other lines:
        # its write's checksum tells, at the end of the read
        (
            "UPDATE twophase_staged_chunks SET body_gz = %s, checksum = NULL",
            "changed after the decision",
        ),
        # the chunk recompressed from other lines, the count kept: a valid gzip member
        (
            "UPDATE twophase_staged_chunks SET body_gz = %s",
            "changed after the decision",
        ),
        # no longer a gzip member
        ("UPDATE twophase_staged_chunks SET body_gz = 'm v=1 1'::bytea", "damaged"),
    ],
)
@pytest.mark.lanes(1)
def test_changed_compressed_chunks_are_detected_before_commit(
    tp: TwoPhase, staging_url: str, tamper: str, error: str
) -> None:
    """I1 over the stored bytes: a tampered gzip member is refused, the epoch stays
    PRECOMMITTED (what is no gzip member at all, as it is read)."""
    lease = begin_run(tp, "s", "r1", "q1")
    tp.ledger.decide(lease, 0, stage(tp, "s", 0, [lines(0, 3)]))
    other = StagedChunk.of_lines("w", 0, lines(1, 3), compressed=True).stored
    with psycopg.connect(admin_conninfo(staging_url)) as conn:
        conn.execute(tamper, (other,) if "%s" in tamper else None)
    with pytest.raises(PermanentError, match=error):
        tp.promoter.promote(lease, 0)
    assert epoch_row(staging_url, "s", 0)["state"] == EpochState.PRECOMMITTED


def test_promotion_is_repeatable(tp: TwoPhase) -> None:
    """Promoting the same fixed point set twice leaves InfluxDB as once (I4, I8)."""
    lease = begin_run(tp, "s", "r1", "q1")
    tp.ledger.decide(lease, 0, stage(tp, "s", 0, [lines(0, 20)]))
    plan = tp.ledger.plan_promotion(lease, 0)  # a promotion that "crashed" after planning
    assert len(plan.writes) == 1
    tp.promoter.promote(lease, 0)
    first = influx_rows(tp.config.target, M)
    tp.ledger.record_error("s", 0, "simulated")
    with psycopg.connect(admin_conninfo(tp.config.staging.psycopg_conninfo())) as conn:
        conn.execute("UPDATE twophase_epochs SET state = 'PRECOMMITTED'")
    tp.promoter.promote(lease, 0)
    assert influx_rows(tp.config.target, M) == first


def test_fenced_run_cannot_claim_the_sink_back(tp: TwoPhase) -> None:
    """I5 across processes: a zombie driver's fresh process may not re-fence the newer run."""
    begin_run(tp, "s", "r1", "q1")
    newer = begin_run(tp, "s", "r2", "q1")
    with pytest.raises(FencedError, match="cannot claim the sink again"):
        begin_run(tp, "s", "r1", "q1")
    assert begin_run(tp, "s", "r2", "q1") == newer  # the owner's own re-claim is a no-op
    tp.committer.commit(newer, 0, stage(tp, "s", 0, [lines(0, 2)], run="r2"))


def test_partition_writes_take_one_write_per_partition_of_the_run(tp: TwoPhase) -> None:
    """A decision without task results (dead letters split upstream) takes each
    partition's first attempt of this run, never another run's or a second attempt."""
    first = stage(tp, "s", 4, [lines(4, 2), lines(4, 3, host="b")])
    retried = stage(tp, "s", 4, [lines(4, 2)], attempt=1)
    crashed_run = stage(tp, "s", 4, [lines(4, 2), lines(4, 3), lines(4, 1)], run="r0")
    stage(tp, "s", 5, [lines(5, 2)])  # another epoch
    chosen = tp.reader.partition_writes("s", 4, "r1", "q1")
    assert [(m.write_id, m.partition_id, m.attempt) for m in chosen] == [
        (m.write_id, m.partition_id, m.attempt) for m in first
    ]
    assert chosen == first  # points, checksums, run and query as staged
    assert retried[0] not in chosen and crashed_run[2] not in chosen
    assert tp.reader.partition_writes("s", 4, "r2", "q1") == []
    lease = begin_run(tp, "s", "r1", "q1")
    assert tp.committer.commit(lease, 4, chosen).promoted.delivered == 5
    assert influx_count(tp.config.target, M) == 5


def test_writes_staged_into_another_store_are_named_as_such(tp: TwoPhase) -> None:
    """Executors with another TWOPHASE_STAGING_URL than the driver's (a cluster whose
    workers carry their own environment): the vote says so, not just "not staged"."""
    import dataclasses

    lease = begin_run(tp, "s", "r1", "q1")
    (message,) = stage(tp, "s", 0, [lines(0, 3)])
    assert message.store == tp.db.config.display_url
    elsewhere = dataclasses.replace(
        message, write_id=str(uuid.uuid4()), store="postgresql+psycopg://x@other:5432/db"
    )
    with pytest.raises(PermanentError, match="staged into postgresql\\+psycopg://x@other") as info:
        tp.ledger.decide(lease, 0, [elsewhere])
    assert "spark.executorEnv.TWOPHASE_STAGING_URL" in str(info.value)
    tp.committer.commit(lease, 0, [message])  # the right write still decides
