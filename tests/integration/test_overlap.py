"""``promotion = overlap`` against the real servers: a task's writes reach the targets
before the epoch is decided, the commit sends only what they lack and discards the
writes it did not choose; nothing goes early for a decided epoch, behind a pending one,
to a target that is down, or to a transactional target."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import psycopg
import pytest

from tests.integration.fanout_helpers import Targets, proxied_targets
from tests.staging import M, scalar
from tests.support import (
    Influx,
    Stored,
    begin_run,
    influx_count,
    postgresql_target,
    staging_config_for,
    two_phase,
)
from twophase.config import OVERLAP, InfluxConfig, StagingConfig, TargetConfig
from twophase.model import CommitMessage, EpochState
from twophase.protocol.overlap import Sending, Sent
from twophase.protocol.runtime import TwoPhase

CHUNK = 5  # points per staged chunk: a write of stage_writes holds 4 x 5 = 20
POINTS = 50  # per partition: writes of 20, 20 and 10
EPOCH_ROW = "SELECT count(*) FROM twophase_epochs WHERE sink_id = 's' AND epoch = %s"
WRITE_ROWS = "SELECT count(*) FROM twophase_writes WHERE write_id = ANY(%s::uuid[])"


@pytest.fixture
def chunked(staging_url: str) -> StagingConfig:
    return staging_config_for(staging_url, staging_chunk_points=CHUNK)


@pytest.fixture
def one(influx_url: str) -> Iterator[Targets]:
    """Target a of the real InfluxDB behind a fault proxy that counts the lines written."""
    with proxied_targets(influx_url, ("a",), promotion=OVERLAP) as targets:
        yield targets


def parts(epoch: int, offset: float = 0.0) -> list[list[str]]:
    """Two partitions of distinct points, a microsecond apart (a PostgreSQL target keeps
    times to the microsecond)."""
    base = 1_700_000_000_000_000_000 + epoch * 1_000_000_000_000
    every = [
        f"{M},host=a,n={i % 3} v={i + offset},e={epoch}i {base + i * 1000}"
        for i in range(2 * POINTS)
    ]
    return [every[:POINTS], every[POINTS:]]


def held(sent: Sent, target: str) -> set[str]:
    """The writes ``target`` took before the decision."""
    return {w for group in sent.by_target[target] for w in group}


def stage_while_sending(
    tp: TwoPhase,
    sending: Sending,
    epoch: int,
    partitions: list[list[str]],
    run: str = "r1",
    attempt: int = 0,
) -> tuple[list[CommitMessage], list[bool]]:
    """Each partition staged write by write, each write waited for (sent if it could
    be) before the next is staged; the messages and what each wait returned."""
    messages, waits = [], []
    for p, part in enumerate(partitions):
        for message in tp.stager.stage_writes(
            "s", epoch, part, partition_id=p, attempt=attempt, run_id=run, query_id="q1"
        ):
            messages.append(message)
            waits.append(sending.wait_for(message.write_id, 10))
    return messages, waits


def test_writes_reach_the_target_before_the_decision_and_are_not_sent_again(
    chunked: StagingConfig, one: Targets, staging_url: str
) -> None:
    direct = one.direct["a"]
    with two_phase(chunked, one.config) as tp:
        assert tp.stager.write_points == 4 * CHUNK
        lease = begin_run(tp, "s", "r1", "q1")
        sending = tp.overlap.start(lease, 0)
        messages, waits = stage_while_sending(tp, sending, 0, parts(0))
        assert [m.points for m in messages] == [20, 20, 10, 20, 20, 10]
        assert all(waits)
        # in InfluxDB while the epoch is undecided
        assert influx_count(direct, M) == 2 * POINTS
        assert scalar(staging_url, EPOCH_ROW, 0) == 0
        sent = sending.finish()
        assert held(sent, "a") == sent.seen == {m.write_id for m in messages}
        assert sum(d for d, _ in sent.by_target["a"].values()) == 2 * POINTS
        assert one.proxies["a"].lines == 2 * POINTS

        outcome = tp.committer.commit(lease, 0, messages, sent)
        assert (outcome.state, outcome.replay) == (EpochState.COMMITTED, False)
        assert outcome.promoted is not None
        assert (outcome.promoted.delivered, outcome.promoted.rejected) == (2 * POINTS, 0)
    assert one.proxies["a"].lines == 2 * POINTS  # the commit sent none of it again
    assert stored(direct) == rows_of(parts(0))
    assert scalar(staging_url, "SELECT state FROM twophase_epochs WHERE epoch = 0") == "COMMITTED"
    assert scalar(staging_url, "SELECT points_delivered FROM twophase_epochs") == 2 * POINTS


def test_a_failed_attempts_write_is_sent_early_and_discarded_once_decided(
    chunked: StagingConfig, one: Targets, staging_url: str
) -> None:
    """A task attempt commits its first write and dies; its retry stages the same points
    again. The decision names the retry's writes only: the first attempt's is removed."""
    direct = one.direct["a"]
    with two_phase(chunked, one.config) as tp:
        lease = begin_run(tp, "s", "r1", "q1")
        sending = tp.overlap.start(lease, 0)
        failed = next(tp.stager.stage_writes("s", 0, parts(0)[0], run_id="r1", query_id="q1"))
        assert sending.wait_for(failed.write_id, 10)
        assert influx_count(direct, M) == 20  # the failed attempt's first write, early
        messages, waits = stage_while_sending(tp, sending, 0, parts(0), attempt=1)
        assert all(waits)
        sent = sending.finish()
        assert sent.seen == {failed.write_id} | {m.write_id for m in messages}
        assert held(sent, "a") == sent.seen

        outcome = tp.committer.commit(lease, 0, messages, sent)
        assert outcome.state == EpochState.COMMITTED and outcome.promoted is not None
        # the orphan's 20 points are not the epoch's: the counts are the decided writes'
        assert outcome.promoted.delivered == 2 * POINTS
    assert scalar(staging_url, WRITE_ROWS, [failed.write_id]) == 0
    assert scalar(staging_url, WRITE_ROWS, [m.write_id for m in messages]) == len(messages)
    assert scalar(staging_url, "SELECT points_delivered FROM twophase_epochs") == 2 * POINTS
    assert stored(direct) == rows_of(parts(0))


def test_a_point_refused_early_is_one_dead_letter_and_counted_once(
    chunked: StagingConfig, one: Targets, staging_url: str
) -> None:
    """InfluxDB refuses a point of an early write (field type conflict): the commit
    neither sends it again nor records its dead letter twice."""
    bad = f'{M},host=a,n=0 v="not a float" 1700000000999999000'
    partitions = parts(0)
    with two_phase(chunked, one.config) as tp:
        lease = begin_run(tp, "s", "r1", "q1")
        sending = tp.overlap.start(lease, 0)
        messages, waits = stage_while_sending(tp, sending, 0, [[*partitions[0], bad]])
        assert all(waits)
        sent = sending.finish()
        assert sum(r for _, r in sent.by_target["a"].values()) == 1
        outcome = tp.committer.commit(lease, 0, messages, sent)
        assert outcome.promoted is not None
        assert (outcome.promoted.delivered, outcome.promoted.rejected) == (POINTS, 1)
    assert scalar(staging_url, "SELECT count(*) FROM twophase_dead_letters") == 1
    assert scalar(staging_url, "SELECT points_rejected_promote FROM twophase_epochs") == 1
    assert stored(one.direct["a"]) == rows_of(partitions[:1])


def test_writes_sent_in_one_group_with_an_orphan_are_sent_again_and_counted_once(
    chunked: StagingConfig, one: Targets, staging_url: str
) -> None:
    """Writes committed before the sending starts go in one delivery: a failed attempt's
    write among them makes the decided ones go again at the commit, which counts them
    (and the point InfluxDB refuses) once."""
    bad = f'{M},host=a,n=0 v="not a float" 1700000000999999000'
    partition = [*parts(0)[0], bad]
    with two_phase(chunked, one.config) as tp:
        lease = begin_run(tp, "s", "r1", "q1")
        failed = next(tp.stager.stage_writes("s", 0, partition, run_id="r1", query_id="q1"))
        messages = list(
            tp.stager.stage_writes("s", 0, partition, attempt=1, run_id="r1", query_id="q1")
        )
        sending = tp.overlap.start(lease, 0)
        assert all(sending.wait_for(m.write_id, 10) for m in [failed, *messages])
        sent = sending.finish()
        assert list(sent.by_target["a"]) == [(failed.write_id, *(m.write_id for m in messages))]

        outcome = tp.committer.commit(lease, 0, messages, sent)
        assert outcome.promoted is not None
        assert (outcome.promoted.delivered, outcome.promoted.rejected) == (POINTS, 1)
    assert scalar(staging_url, "SELECT count(*) FROM twophase_dead_letters") == 1
    assert scalar(staging_url, "SELECT points_rejected_promote FROM twophase_epochs") == 1
    assert scalar(staging_url, WRITE_ROWS, [failed.write_id]) == 0
    assert stored(one.direct["a"]) == rows_of(parts(0)[:1])


def test_nothing_goes_early_for_an_epoch_already_decided(
    chunked: StagingConfig, one: Targets, staging_url: str
) -> None:
    """A replay of a COMMITTED epoch, recomputed differently: nothing of it reaches the
    target, before or after its commit (I1, I4)."""
    direct = one.direct["a"]
    with two_phase(chunked, one.config) as tp:
        lease = begin_run(tp, "s", "r1", "q1")
        tp.committer.commit(lease, 0, stage_all(tp, 0, parts(0)))
        before = stored(direct)
        one.proxies["a"].reset_counts()

        replay = begin_run(tp, "s", "r2", "q1")
        sending = tp.overlap.start(replay, 0)
        messages, waits = stage_while_sending(tp, sending, 0, parts(0, 0.5), run="r2")
        assert not any(waits)  # the sending ended without sending any
        sent = sending.finish()
        assert (sent.by_target, sent.seen) == ({}, frozenset())
        assert stored(direct) == before

        outcome = tp.committer.commit(replay, 0, messages, sent)
        assert (outcome.state, outcome.replay, outcome.promoted) == (
            EpochState.COMMITTED,
            True,
            None,
        )
    assert one.proxies["a"].lines == 0
    assert stored(direct) == before
    assert scalar(staging_url, WRITE_ROWS, [m.write_id for m in messages]) == 0


def test_nothing_goes_early_while_an_older_epoch_is_pending(
    chunked: StagingConfig, one: Targets
) -> None:
    """Epoch 0 decided and not promoted (the driver died): epoch 1's points wait, and its
    commit recovers 0 first (I3)."""
    direct = one.direct["a"]
    with two_phase(chunked, one.config) as tp:
        lease = begin_run(tp, "s", "r1", "q1")
        tp.ledger.decide(lease, 0, stage_all(tp, 0, parts(0)))
        sending = tp.overlap.start(lease, 1)
        messages, waits = stage_while_sending(tp, sending, 1, parts(1))
        assert not any(waits)
        sent = sending.finish()
        assert sent.by_target == {}
        assert influx_count(direct, M) == 0

        outcome = tp.committer.commit(lease, 1, messages, sent)
        assert (outcome.state, outcome.recovered) == (EpochState.COMMITTED, (0,))
        assert tp.ledger.pending("s") == []
    assert stored(direct) == rows_of(parts(0) + parts(1))


def test_a_target_that_is_down_is_left_out_and_gets_the_whole_epoch_from_the_commit(
    chunked: StagingConfig, influx_url: str
) -> None:
    with (
        proxied_targets(influx_url, promotion=OVERLAP, target_deadline_s=0.5) as two,
        two_phase(chunked, two.config) as tp,
    ):
        lease = begin_run(tp, "s", "r1", "q1")
        two.down("b")
        sending = tp.overlap.start(lease, 0)
        messages, waits = stage_while_sending(tp, sending, 0, parts(0))
        assert all(waits)  # seen; sent to a
        sent = sending.finish()
        assert set(sent.by_target) == {"a"}
        assert held(sent, "a") == {m.write_id for m in messages}
        assert influx_count(two.direct["a"], M) == 2 * POINTS
        assert influx_count(two.direct["b"], M) == 0

        two.up("b")
        for proxy in two.proxies.values():
            proxy.reset_counts()
        outcome = tp.committer.commit(lease, 0, messages, sent)
        assert outcome.state == EpochState.COMMITTED and outcome.promoted is not None
        assert outcome.promoted.delivered == 2 * POINTS
        assert two.proxies["a"].lines == 0  # a held it all
        assert two.proxies["b"].lines == 2 * POINTS  # b: the whole epoch, once
        for target in two.direct.values():
            assert stored(target) == rows_of(parts(0))


def test_nothing_goes_early_to_a_postgresql_target_and_the_commit_delivers_it(
    chunked: StagingConfig, influx: InfluxConfig, base_staging_url: str
) -> None:
    """Targets a (InfluxDB) and b (PostgreSQL, one transaction per epoch): a gets the
    writes early, b only from the commit."""
    with postgresql_target(base_staging_url, "tp_overlap_pg") as (pg, admin):
        config = dataclasses.replace(
            influx,
            promotion=OVERLAP,
            targets=(TargetConfig("a", influx), TargetConfig("b", pg)),
        )
        with two_phase(chunked, config) as tp:
            lease = begin_run(tp, "s", "r1", "q1")
            sending = tp.overlap.start(lease, 0)
            messages, waits = stage_while_sending(tp, sending, 0, parts(0))
            assert all(waits)
            assert pg_rows(admin) == 0
            sent = sending.finish()
            assert set(sent.by_target) == {"a"}

            outcome = tp.committer.commit(lease, 0, messages, sent)
            assert outcome.state == EpochState.COMMITTED
        assert pg_rows(admin) == 2 * POINTS
    assert stored(influx) == rows_of(parts(0))


def pg_rows(admin: str) -> int:
    """Rows of the measurement's table; 0 before the table exists."""
    with psycopg.connect(admin) as conn:
        if conn.execute("SELECT to_regclass(%s)", (M,)).fetchone() == (None,):
            return 0
        row = conn.execute(f'SELECT count(*) FROM "{M}"').fetchone()  # noqa: S608 our own name
        assert row is not None
        return int(row[0])


def stage_all(tp: TwoPhase, epoch: int, partitions: list[list[str]]) -> list[CommitMessage]:
    return [
        tp.stager.stage("s", epoch, part, partition_id=p, run_id="r1", query_id="q1")
        for p, part in enumerate(partitions)
    ]


def rows_of(partitions: list[list[str]]) -> list[Stored]:
    """What the target holds for exactly these points, each once (``parts``' shape:
    ``proto,host=..,n=.. v=<float>,e=<int>i <ns>``), sorted as ``stored`` sorts."""
    rows: list[Stored] = []
    for line in (line for part in partitions for line in part):
        series, fields, ns = line.split(" ")
        tags = dict(pair.split("=") for pair in series.split(",")[1:])
        values = dict(pair.split("=") for pair in fields.split(","))
        rows.append((int(ns), tags, {"e": int(values["e"][:-1]), "v": float(values["v"])}))
    return sorted(rows, key=repr)


def stored(target: InfluxConfig) -> list[Stored]:
    """Every point of the measurement in ``target``, sorted."""
    assert target.database is not None
    return sorted(Influx(target.url, target.database).points(M).get(M, []), key=repr)
