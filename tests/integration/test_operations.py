"""The operations API called directly (no CLI): it returns data, reports through hooks,
and refuses what the CLI refuses. The CLI tests run the same operations through the
installed script."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import text_of
from tests.integration.cli_helpers import OTHER, SINK, known_store, make_idle
from tests.staging import lines
from tests.support import begin_run, influx_rows
from twophase import operations as ops
from twophase.config import StagingConfig
from twophase.errors import EpochRangeError, RefusedError, StateError, UnknownSinkError, UsageError
from twophase.influx.query import query_v1
from twophase.model import EpochState
from twophase.operations import Guard, Hooks, Progress
from twophase.operations.resender import Resender, plan_resend
from twophase.operations.verify import staged_lines
from twophase.protocol.commit.runtime import TwoPhase
from twophase.store.database import SCHEMA_REVISION
from twophase.store.views import EpochRange, Views

M = "proto"


class Recorder:
    """Hooks that remember what an operation reported, and answer its questions."""

    def __init__(self, answer: bool = True) -> None:
        self.progress: list[Progress] = []
        self.warnings: list[str] = []
        self.questions: list[str] = []
        self.answer = answer

    def confirm(self, question: str) -> None:
        self.questions.append(question)
        if not self.answer:
            raise RefusedError("declined")

    def hooks(self) -> Hooks:
        return Hooks(self.progress.append, self.warnings.append, self.confirm)


def test_status_and_epochs_return_data(tp: TwoPhase) -> None:
    known_store(tp)
    staging = tp.config.staging
    rows = {s.sink_id: s for s in ops.status(staging)}
    assert set(rows) == {SINK, OTHER}
    s = rows[SINK]
    assert (s.last_committed_epoch, s.precommitted_epochs, s.oldest_precommitted_epoch) == (2, 1, 3)
    assert s.dead_letters == 2 and s.owner_live
    listing = ops.epochs(staging, SINK)
    assert [e.state for e in listing.epochs] == [EpochState.COMMITTED] * 3 + [
        EpochState.PRECOMMITTED
    ]
    assert listing.events is None
    one = ops.epochs(staging, SINK, EpochRange(3, 3))
    assert [e.event for e in one.events or ()] == ["decided"]
    with pytest.raises(UsageError):
        ops.epochs(staging, SINK, EpochRange(0, 1), last=2)
    with pytest.raises(UnknownSinkError):
        ops.status(staging, "ghost")
    with pytest.raises(EpochRangeError):
        ops.epochs(staging, SINK, EpochRange(9, 9))


def test_recover_refuses_a_live_owner_then_reports_progress_when_forced(tp: TwoPhase) -> None:
    known_store(tp)
    with pytest.raises(RefusedError, match="owned by run r1"):
        ops.recover(tp.config, SINK)
    seen = Recorder()
    report = ops.recover(tp.config, SINK, Guard(force=True), seen.hooks())
    assert [(r.epoch, r.delivered, r.rejected) for r in report.recovered] == [(3, 10, 0)]
    assert seen.progress[-1] == Progress("recover", "points", 10, 10, f"{SINK}#3")
    assert any("going ahead because of --force" in w for w in seen.warnings)
    assert ops.recover(tp.config, SINK, Guard(force=True)).recovered == ()


def test_verify_and_resend_after_a_loss(tp: TwoPhase, staging_url: str) -> None:
    known_store(tp)
    ops.recover(tp.config, SINK, Guard(force=True))
    ((default, checked),) = [(r.target, r.report) for r in ops.verify(tp.config, SINK)]
    assert default == "default" and checked.ok
    influx = tp.config.target
    query_v1(influx.url, influx.influxdb.database, f'DROP MEASUREMENT "{M}"', method="POST")
    (lost,) = [r.report for r in ops.verify(tp.config, SINK)]
    assert not lost.ok and sum(d.missing for d in lost.differences) == 40
    make_idle(staging_url)
    seen = Recorder()
    report = ops.resend(tp.config, SINK, hooks=seen.hooks())
    assert [(r.epoch, r.points_sent, r.points_rejected) for r in report.resent] == [
        (0, 10, 0),
        (1, 10, 0),
        (2, 10, 1),
        (3, 10, 0),
    ]
    assert seen.progress[-1].done == seen.progress[-1].total == 41
    assert all(r.report.ok for r in ops.verify(tp.config, SINK, EpochRange(0, 3)))


def test_abort_asks_and_a_declined_question_changes_nothing(tp: TwoPhase, staging_url: str) -> None:
    known_store(tp)
    make_idle(staging_url)
    staging = tp.config.staging
    declined = Recorder(answer=False)
    with pytest.raises(RefusedError):
        ops.abort(staging, SINK, 3, "bad data", hooks=declined.hooks())
    assert "Its 10 staged points are deleted" in declined.questions[0]
    assert ops.epochs(staging, SINK, EpochRange(3, 3)).epochs[0].state == EpochState.PRECOMMITTED
    done = ops.abort(staging, SINK, 3, "bad data", hooks=Recorder().hooks())
    assert (done.state, done.points_discarded, done.reason) == (EpochState.ABORTED, 10, "bad data")


def test_gc_reset_and_dead_letters(tp: TwoPhase, staging_url: str, tmp_path: Path) -> None:
    known_store(tp)
    staging = tp.config.staging
    listing = ops.dead_letters(staging, SINK)
    assert listing.total == 2 and {d.phase for d in listing.dead_letters} == {"stage", "promote"}
    export = ops.export_dead_letters(staging, SINK, str(tmp_path / "dl.jsonl"))
    rows = [json.loads(x) for x in (tmp_path / "dl.jsonl").read_text().splitlines()]
    assert export.exported == 2 and {r["phase"] for r in rows} == {"stage", "promote"}
    dry = ops.gc(staging, SINK, retention_s=0, dry_run=True)
    assert (dry.total("epochs_purged"), dry.total("points_purged")) == (3, 31)
    seen = Recorder()
    done = ops.gc(staging, SINK, retention_s=0, hooks=seen.hooks())
    assert done.total("epochs_purged") == 3 and len(seen.questions) == 1
    with pytest.raises(StateError, match="run `twophase recover --sink s` before"):
        ops.reset(staging, SINK)
    ops.recover(tp.config, SINK, Guard(force=True))
    make_idle(staging_url)
    reset = ops.reset(staging, SINK, hooks=Recorder().hooks())
    assert (reset.sink_id, reset.query_id, reset.epochs_forgotten) == (SINK, "q1", 4)


@pytest.mark.lanes(1)  # the order over one connection (per lane: test_lanes.py)
def test_promote_resend_and_verify_read_an_epoch_in_the_same_order(tp: TwoPhase) -> None:
    """One function gives an epoch's writes in promotion order: promotion, an
    operator's resend and verify's rebuilt state all read the same sequence. Two tasks
    write the same point keys with different values: the write promoted last wins, the
    same way every time."""
    sent: list[list[str]] = []

    class Recording:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def write(self, body: bytes, gzipped: bool = False) -> None:
            sent[-1] += text_of(body, gzipped).split("\n")
            self.inner.write(body, gzipped)

        def close(self) -> None:
            self.inner.close()

    config = replace(tp.config, target=replace(tp.config.target, batch_points=7))
    with TwoPhase.open(config, writer=Recording(tp.writer)) as parts:
        lease = begin_run(parts, SINK, "r1", "q1")
        # staged in the order 2, 0, 1; partitions 0 and 2 write the same keys
        for_part = {0: lines(0, 12), 1: lines(1, 5), 2: lines(0, 12, value_offset=0.5)}
        messages = [
            parts.stager.stage(SINK, 0, for_part[p], partition_id=p, run_id="r1", query_id="q1")
            for p in (2, 0, 1)
        ]
        sent.append([])
        parts.committer.commit(lease, 0, messages)
        sent.append([])
        epochs = Views(parts.db).epochs(SINK)
        plan = plan_resend(SINK, epochs, True)
        Resender(parts.db, parts.ledger, parts.targets, list(parts.deliveries.values())).resend(
            lease, plan, "test"
        )
        verified = list(staged_lines(parts.reader, parts.reader.plan(SINK, 0), set()))
    assert sent[0] == sent[1] == verified == for_part[0] + for_part[1] + for_part[2]
    values = {row[0]: dict(row[2])["v"] for row in influx_rows(tp.config.target, M)}
    base = 1_700_000_000_000_000_000  # lines(0, ...)'s first timestamp
    assert [values[base + i] for i in range(12)] == [i + 0.5 for i in range(12)]


def test_an_ended_run_is_not_live_and_a_silent_one_is_unknown(
    tp: TwoPhase, staging_url: str
) -> None:
    """A run that recorded its end needs no --force; one that went silent without an end
    (a SIGKILLed driver) is live within the window, then unknown."""
    known_store(tp)
    state = {s.sink_id: (s.owner_state, s.owner_live) for s in ops.status(tp.config.staging)}
    assert state == {SINK: ("live", True), OTHER: ("live", True)}
    make_idle(staging_url, OTHER)
    assert ops.status(tp.config.staging, OTHER)[0].owner_state == "unknown"
    assert tp.runs.end(SINK, "r1", "stopped") is True
    assert tp.runs.end(SINK, "r1", "failed") is False  # the first end stands
    assert tp.runs.end(SINK, "r-never-claimed", "stopped") is False
    with pytest.raises(UsageError, match="not 'crashed'"):
        tp.runs.end(SINK, "r1", "crashed")
    s = ops.status(tp.config.staging, SINK)[0]
    assert (s.owner_run_id, s.owner_state, s.owner_end_reason, s.owner_live) == (
        "r1",
        "ended",
        "stopped",
        False,
    )
    report = ops.recover(tp.config, SINK)  # no --force, no warning: the owner stopped
    assert [r.epoch for r in report.recovered] == [3]
    assert ops.status(tp.config.staging, SINK)[0].owner_state is None  # the CLI's run now


def test_schema_operations_return_data_and_ask_before_a_downgrade(staging: StagingConfig) -> None:
    head = ops.current_schema(staging).after
    history = ops.schema_history(staging)
    assert (history.current, history.head) == (head, head)
    assert history.revisions[0] == ops.SchemaRevision(
        "0001_initial", None, "initial staging schema", head=False, current=False
    )

    declined = Recorder(answer=False)
    with pytest.raises(RefusedError):
        ops.downgrade_schema(staging, "0004_sink_counters", declined.hooks())
    assert f"from {SCHEMA_REVISION} to 0004_sink_counters" in declined.questions[0]
    assert ":twophase@" not in declined.questions[0]  # the URL shown has no password
    assert ops.current_schema(staging).after == head

    down = ops.downgrade_schema(staging, "0004", Recorder().hooks())
    assert (down.before, down.after, down.at_head) == (head, "0004_sink_counters", False)
    with pytest.raises(UsageError, match="cannot downgrade from 0004_sink_counters"):
        ops.downgrade_schema(staging, "head", Recorder().hooks())
    assert ops.upgrade_schema(staging).at_head

    script = ops.downgrade_sql("0004_sink_counters")
    assert (script.action, script.start, script.target) == ("downgrade", head, "0004_sink_counters")
    assert ops.upgrade_sql("0004:0005").sql.count("Running upgrade") == 1
