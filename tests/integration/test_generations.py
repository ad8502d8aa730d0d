"""Generations: a PostgreSQL target's record of delivered epochs names the generation of
the sink's epoch numbers, so that what the staging store gives out again (a reset's
new query numbering its epochs from 0, a ``targets resync --from-epoch``) reaches the
target whole, while a re-send within one generation is still skipped. The record table
of an older version is upgraded in place.

The sink delivers to InfluxDB and to PostgreSQL at once, as the seeds' job does."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support import postgresql_target
from twophase.config import NamedTarget, StagingConfig, TargetConfig, TwoPhaseConfig
from twophase.errors import TransientWriteError
from twophase.model import CommitMessage, EpochState
from twophase.operations import Guard, recover, reset, resync
from twophase.postgresql import PostgresWriter
from twophase.protocol.commit.runtime import TwoPhase
from twophase.targets import make_readback
from twophase.testing import crash
from twophase.testing.support import Case, Held, difference, expected, held

FORCE = Guard(force=True)  # the test's own runs just used the sink
RECORD = "SELECT generation, epoch, delivered FROM twophase_delivered ORDER BY generation, epoch"
# An older version's record table, as it created it (no generation)
OLD_RECORD = (
    "CREATE TABLE twophase_delivered (sink_id text NOT NULL, target text NOT NULL,"
    " epoch bigint NOT NULL, delivered bigint NOT NULL, rejected bigint NOT NULL,"
    " delivered_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (sink_id, target, epoch))"
)


@dataclasses.dataclass(frozen=True)
class Sink:
    """A sink of two targets, ``influx`` and ``pg``, and the PostgreSQL one's database."""

    config: TwoPhaseConfig
    influx: TargetConfig
    pg: TargetConfig
    pg_admin: str
    case: Case

    def sql(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.pg_admin, autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def holds(self, want: list[Held]) -> None:
        """Both targets hold exactly ``want``, each point once."""
        for name, config in (("influx", self.influx), ("pg", self.pg)):
            got = held(make_readback(config), self.case)
            assert got == want, f"target {name}: {difference(got, want)}"


@pytest.fixture
def sink(base_staging_url: str, staging: StagingConfig, influx: TargetConfig) -> Iterator[Sink]:
    with postgresql_target(base_staging_url, "tp_generation") as (pg, admin):
        both = (NamedTarget("influx", influx), NamedTarget("pg", pg))
        config = TwoPhaseConfig(staging, dataclasses.replace(influx, targets=both))
        yield Sink(config, influx, pg, admin, Case.new())


def stage(
    tp: TwoPhase, sink: Sink, epoch: int, lines: list[str], query: str
) -> list[CommitMessage]:
    """The epoch's lines staged by two tasks of ``query``."""
    middle = len(lines) // 2
    return [
        tp.stager.stage(sink.case.sink, epoch, part, partition_id=n, run_id="r", query_id=query)
        for n, part in enumerate((lines[:middle], lines[middle:]))
    ]


def commit(sink: Sink, query: str, epochs: dict[int, list[str]]) -> None:
    """A run of ``query`` commits ``epochs`` to both targets."""
    with TwoPhase.open(sink.config) as tp:
        lease = tp.committer.claim(sink.case.sink, f"run-{uuid.uuid4().hex[:8]}", query)
        for epoch, lines in epochs.items():
            outcome = tp.committer.commit(lease, epoch, stage(tp, sink, epoch, lines, query))
            assert outcome.state == EpochState.COMMITTED and outcome.promoted is not None
            assert outcome.promoted.delivered == len(lines)


def points(sink: Sink, host: str, epochs: range) -> dict[int, list[str]]:
    """Five points an epoch, of series ``host``: two queries' epochs of the same number
    hold different points."""
    return {epoch: sink.case.lines(epoch, 5, host=host) for epoch in epochs}


def every(*queries: dict[int, list[str]]) -> list[str]:
    return [line for query in queries for lines in query.values() for line in lines]


def test_a_reset_sinks_new_query_reaches_both_targets_whole(sink: Sink) -> None:
    """The new query's epochs 0..2 were the old one's numbers too: PostgreSQL's record of
    them (out of the reset's reach) is of the old generation, and skips none."""
    a, b = points(sink, "a", range(3)), points(sink, "b", range(5))
    commit(sink, "q-a", a)
    done = reset(sink.config.staging, sink.case.sink, guard=FORCE)
    assert done.epochs_forgotten == 3
    commit(sink, "q-b", b)
    sink.holds(expected(every(a, b)))
    assert sink.sql(RECORD) == [(0, e, 5) for e in range(3)] + [(1, e, 5) for e in range(5)]


def test_a_crash_after_the_targets_commit_in_a_new_generation_sends_nothing_twice(
    sink: Sink, tmp_path: Path
) -> None:
    """Killed once PostgreSQL committed the new query's epoch 0, before the staging store
    recorded it: the recovery finds the epoch's record of this generation and sends it
    to PostgreSQL no more (its rows are the versions the killed process wrote)."""
    a, b = points(sink, "a", range(2)), points(sink, "b", range(3))
    commit(sink, "q-a", a)
    reset(sink.config.staging, sink.case.sink, guard=FORCE)
    job = crash.CrashJob(sink.config, sink.case.sink, 0, (tuple(b[0][:2]), tuple(b[0][2:])))
    killed = crash.run(job, "after_target_commit", tmp_path, crash_env())
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    table = sink.case.measurement
    versions = sink.sql(f'SELECT xmin::text, host FROM "{table}" ORDER BY time, host')  # noqa: S608
    assert [host for _, host in versions].count("b") == 5  # committed on PostgreSQL
    report = recover(sink.config, sink.case.sink, guard=FORCE)
    assert [r.epoch for r in report.recovered] == [0]
    assert sink.sql(f'SELECT xmin::text, host FROM "{table}" ORDER BY time, host') == versions  # noqa: S608
    assert sink.sql(RECORD) == [(0, 0, 5), (0, 1, 5), (1, 0, 5)]
    commit(sink, "crash-query", {1: b[1], 2: b[2]})  # the crashed query goes on
    sink.holds(expected(every(a, b)))
    assert sink.sql(RECORD) == [(0, 0, 5), (0, 1, 5), (1, 0, 5), (1, 1, 5), (1, 2, 5)]


def crash_env() -> dict[str, str]:
    """The crash child's environment: this one's, with this process's ``sys.path`` (the
    tree under test) as ``PYTHONPATH``."""
    paths = [p for p in sys.path if p and Path(p).exists()]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def test_a_resync_from_an_epoch_restores_rows_the_table_lost(sink: Sink) -> None:
    """Rows deleted from PostgreSQL's table by hand, its record intact: a resync from
    epoch 1 sends epochs 1 and 2 again, in a new generation of that target only."""
    a = points(sink, "a", range(3))
    commit(sink, "q-a", a)
    table = sink.case.measurement
    epoch_one = a[1][0].rsplit(" ", 1)[1]
    sink.sql(f'DELETE FROM "{table}" WHERE time >= to_timestamp({int(epoch_one) / 1e9})')  # noqa: S608
    assert len(held(make_readback(sink.pg), sink.case)) == 5  # epoch 0's only
    report = resync(sink.config, sink.case.sink, "pg", from_epoch=1, guard=FORCE)
    assert report.delivered == (1, 2)
    sink.holds(expected(every(a)))
    assert sink.sql(RECORD) == [(0, 0, 5), (0, 1, 5), (0, 2, 5), (1, 1, 5), (1, 2, 5)]
    with TwoPhase.open(sink.config) as tp:  # the other target keeps its generation
        assert tp.targets.generation(sink.case.sink, "influx") == 0
        assert tp.targets.generation(sink.case.sink, "pg") == 1
    commit(sink, "q-a", {3: sink.case.lines(3, 5, host="a")})  # the query goes on
    assert sink.sql(RECORD)[-1] == (1, 3, 5)
    # each resync from an epoch takes a generation the sink never gave out before
    resync(sink.config, sink.case.sink, "influx", from_epoch=3, guard=FORCE)
    resync(sink.config, sink.case.sink, "pg", from_epoch=3, guard=FORCE)
    with TwoPhase.open(sink.config) as tp:
        assert tp.targets.generation(sink.case.sink, "influx") == 2
        assert tp.targets.generation(sink.case.sink, "pg") == 3
    assert sink.sql(RECORD)[-1] == (3, 3, 5)
    sink.holds(expected([*every(a), *sink.case.lines(3, 5, host="a")]))


def test_a_reset_after_a_resync_starts_past_the_targets_generation(sink: Sink) -> None:
    """A target's generation moved on by a resync, then the sink reset: the next query's
    targets start in a generation neither had (pg's epoch 1 of generation 1 was the
    resync's, and must not skip the new query's epoch 1)."""
    a, b = points(sink, "a", range(2)), points(sink, "b", range(2))
    commit(sink, "q-a", a)
    resync(sink.config, sink.case.sink, "pg", from_epoch=1, guard=FORCE)
    reset(sink.config.staging, sink.case.sink, guard=FORCE)
    commit(sink, "q-b", b)
    sink.holds(expected(every(a, b)))
    generations = {g for g, _, _ in sink.sql(RECORD)}
    assert generations == {0, 1, 2}


# --- the record of an older version ------------------------------------------------------


def test_an_older_record_is_upgraded_in_place_and_its_epochs_still_found(sink: Sink) -> None:
    """A record table an older version made, holding an epoch in flight across the
    upgrade: it gets the generation (0, every sink's until its first reset) and the key
    that names it, and the epoch is still found and skipped."""
    sink.sql(OLD_RECORD)
    sink.sql(
        "INSERT INTO twophase_delivered (sink_id, target, epoch, delivered, rejected)"
        " VALUES (%s, 'pg', 4, 7, 1)",
        sink.case.sink,
    )
    writer = PostgresWriter(sink.pg)
    try:
        assert writer.begin(sink.case.sink, 4, "pg", generation=0) == (7, 1)
        assert writer.begin(sink.case.sink, 4, "pg", generation=1) is None
        writer.write("\n".join(sink.case.lines(4, 2)).encode())
        writer.commit(2, 0)
    finally:
        writer.close()
    key = sink.sql(
        "SELECT a.attname FROM pg_constraint k, unnest(k.conkey) WITH ORDINALITY u(n, i),"
        " pg_attribute a WHERE k.conrelid = 'twophase_delivered'::regclass AND k.contype = 'p'"
        " AND a.attrelid = k.conrelid AND a.attnum = u.n ORDER BY u.i"
    )
    assert [name for (name,) in key] == ["sink_id", "target", "generation", "epoch"]
    assert sink.sql(RECORD) == [(0, 4, 7), (1, 4, 2)]


def test_an_older_record_in_use_is_upgraded_later(sink: Sink) -> None:
    """An older version's epoch holds the record table: the upgrade waits a short while
    for its lock and gives up, retryable, rather than stall that table's writers; once
    the table is free it goes through."""
    sink.sql(OLD_RECORD)
    with psycopg.connect(sink.pg_admin) as holder:
        holder.execute(  # as an older version's open epoch does
            "INSERT INTO twophase_delivered (sink_id, target, epoch, delivered, rejected)"
            " VALUES ('older', 'pg', 0, 1, 0)"
        )
        writer = PostgresWriter(sink.pg)
        try:
            with pytest.raises(TransientWriteError, match="in use"):
                writer.begin(sink.case.sink, 0, "pg", generation=0)
            holder.commit()
            assert writer.begin(sink.case.sink, 0, "pg", generation=0) is None
            writer.rollback()
        finally:
            writer.close()
    assert sink.sql("SELECT generation, sink_id FROM twophase_delivered") == [(0, "older")]
