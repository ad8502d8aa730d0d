"""Operator commands that send or write for longer than the staging store's idle limit
(``staging_session_timeout``): none holds a transaction open while it waits on a slow
target or a slow consumer, so PostgreSQL never ends their sessions."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from devkit.faultproxy import FaultProxy
from tests.integration.cli_helpers import make_idle, sql
from tests.staging import M, lines, stage
from tests.support import admin_conninfo, begin_run, influx_count, staging_config_for, two_phase
from twophase import operations as ops
from twophase.config import TargetConfig, TwoPhaseConfig
from twophase.errors import StateError
from twophase.influx.query import query_v1
from twophase.model import DeadLetter, EpochPlan, Phase
from twophase.operations.resender import Resender, plan_resend
from twophase.protocol.commit.runtime import TwoPhase
from twophase.store.database import Database
from twophase.store.views import EpochRange, Views

SINK = "s"
IDLE_S = 2  # the store's idle limit in these tests
EPOCHS, POINTS, BATCH = 3, 60, 10  # each epoch sent in 6 requests: 3 s behind the proxy
DELAY_S = 0.5  # each answer held this long by the proxy


@pytest.fixture
def slow(influx: TargetConfig) -> Iterator[FaultProxy]:
    with FaultProxy.for_url(influx.url) as proxy:
        yield proxy


def test_resend_of_several_epochs_to_a_slow_target_outlasts_the_idle_limit(
    staging_url: str, influx: TargetConfig, slow: FaultProxy
) -> None:
    """Each epoch takes longer to re-send than the idle limit (larger ones through the
    read cursor): every epoch is re-sent, the target holds every point."""
    staging = staging_config_for(
        staging_url, staging_session_timeout=IDLE_S, staging_chunk_points=BATCH
    )
    fast = dataclasses.replace(influx, batch_points=BATCH)
    with two_phase(staging, fast) as tp:
        lease = begin_run(tp, SINK, "r1", "q1")
        for epoch in range(EPOCHS):
            tp.committer.commit(lease, epoch, stage(tp, SINK, epoch, [lines(epoch, POINTS)]))
    assert influx_count(influx, M) == EPOCHS * POINTS
    query_v1(influx.url, influx.influxdb.database, f'DROP MEASUREMENT "{M}"', method="POST")
    make_idle(staging_url, SINK)

    slow.delay_s = DELAY_S
    started = time.monotonic()
    report = ops.resend(TwoPhaseConfig(staging, dataclasses.replace(fast, url=slow.url)), SINK)
    assert time.monotonic() - started > EPOCHS * IDLE_S  # each epoch outlasted the limit
    assert [(r.epoch, r.points_sent) for r in report.resent] == [(e, POINTS) for e in range(EPOCHS)]
    assert influx_count(influx, M) == EPOCHS * POINTS


LETTERS = 5_000  # more than a page of the export, and than the cursor's fetch


def add_dead_letters(staging_url: str, count: int) -> None:
    """``count`` decided dead letters of sink ``s`` (an epoch decided, its write's)."""
    with psycopg.connect(admin_conninfo(staging_url)) as conn:
        conn.execute(
            "INSERT INTO twophase_sinks (sink_id, query_id, fencing_token) VALUES (%s, 'q', 1)",
            (SINK,),
        )
        write = conn.execute("SELECT gen_random_uuid()").fetchone()[0]  # type: ignore[index]
        conn.execute(
            "INSERT INTO twophase_epochs (sink_id, epoch, state, run_id, query_id, write_ids,"
            " checksum, points_staged) VALUES (%s, 0, 'PRECOMMITTED', 'r', 'q', %s, 'x', 0)",
            (SINK, [write]),
        )
        conn.execute(
            "INSERT INTO twophase_dead_letters (sink_id, epoch, write_id, seq, phase, reason,"
            " payload) SELECT %s, 0, %s, n, 'stage', 'bad', 'm v=' || n FROM generate_series"
            "(1, %s) AS n",
            (SINK, write, count),
        )


def test_dead_letters_read_by_a_slow_consumer_outlast_the_idle_limit(staging_url: str) -> None:
    """A reader that takes longer than the idle limit between rows gets every letter, in
    (epoch, id) order."""
    add_dead_letters(staging_url, LETTERS)
    staging = staging_config_for(staging_url, staging_session_timeout=IDLE_S)
    with Database(staging) as db:
        seen: list[DeadLetter] = []
        for letter in Views(db).dead_letters(SINK, None):
            if len(seen) in (0, 2_500):  # once while the first page is read, once later
                time.sleep(IDLE_S + 1)
            seen.append(letter)
    assert len(seen) == LETTERS
    assert [d.payload for d in seen] == [f"m v={n}" for n in range(1, LETTERS + 1)]
    assert {d.phase for d in seen} == {Phase.STAGE}


def test_an_export_to_a_slow_writer_outlasts_the_idle_limit(
    staging_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The export of many dead letters, its file written slower than the idle limit,
    completes whole."""
    add_dead_letters(staging_url, LETTERS)
    staging = staging_config_for(staging_url, staging_session_timeout=IDLE_S)
    import twophase.operations.store_only as store

    record = store._record
    written: list[int] = []

    def slow_record(row: DeadLetter) -> dict[str, object]:
        if len(written) in (1, 3_000):
            time.sleep(IDLE_S + 1)
        written.append(row.seq)
        return record(row)

    monkeypatch.setattr(store, "_record", slow_record)
    path = tmp_path / "letters.jsonl"
    done = ops.export_dead_letters(staging, SINK, str(path))
    assert done.exported == LETTERS
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["seq"] for r in rows] == list(range(1, LETTERS + 1))


def test_an_epoch_purged_by_gc_while_it_is_re_sent_is_not_half_sent_silently(
    tp: TwoPhase, staging_url: str
) -> None:
    """The resend holds no lock that keeps GC off the epoch: GC purging it between the
    read of its decision and the read of its chunks makes the resend fail, naming the
    purge, and records no ``resent`` event."""
    lease = begin_run(tp, SINK, "r1", "q1")
    tp.committer.commit(lease, 0, stage(tp, SINK, 0, [lines(0, 5)]))
    (delivery,) = tp.deliveries.values()

    class PurgedFirst:
        """The real delivery, GC run just before it reads the epoch."""

        name = delivery.name

        def send(self, plan: EpochPlan, before_request: Callable[[], None]) -> tuple[int, int]:
            assert tp.gc.collect(SINK, ahead_s=10**8).epochs_purged
            return delivery.send(plan, before_request=before_request)

    chosen = plan_resend(SINK, Views(tp.db).select_epochs(SINK, EpochRange()), everything=True)
    resender = Resender(tp.db, tp.ledger, tp.targets, [PurgedFirst()])  # type: ignore[list-item]
    with pytest.raises(StateError, match="purged by GC while it was re-sent"):
        resender.resend(begin_run(tp, SINK, "op", None), chosen, "operator")
    assert sql(
        staging_url, "SELECT count(*) FROM twophase_epoch_events WHERE event = 'resent'"
    ) == [(0,)]
