"""Requeue of dead letters (``twophase dead-letters --requeue``), exactly once.

The scenario: another writer put a string field ``v`` into
measurement ``rq``; the sink's float ``v`` points are refused (field type
conflict) and become dead letters. The operator drops the conflicting
measurement and requeues: InfluxDB then holds every point once. The
installed ``twophase`` script runs as a real process and is SIGKILLed at
every step of the requeue; ``recover`` (and, when the crash came before the
decision, a second requeue) must give the same result.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.cli_helpers import Cli, make_cli, sql
from tests.integration.requeue_helpers import (
    CONFLICTED,
    GOOD,
    SINK,
    drop_conflicting,
    epoch_lines,
    expected,
    held,
    rejected_store,
)
from tests.staging import stage
from tests.support import begin_run
from twophase.config import TargetConfig
from twophase.protocol.commit.runtime import TwoPhase


@pytest.fixture
def cli(staging_url: str, influx: TargetConfig) -> Cli:
    return make_cli(staging_url, influx)


def letters(staging_url: str) -> list[tuple[Any, ...]]:
    return sql(
        staging_url,
        "SELECT epoch, phase, requeued_in FROM twophase_dead_letters WHERE sink_id = %s"
        " ORDER BY id",
        SINK,
    )


def test_rejected_again_stay_dead_letters_once(
    tp: TwoPhase, cli: Cli, staging_url: str, influx: TargetConfig
) -> None:
    rejected = rejected_store(tp, influx)
    dry = cli("dead-letters", "--sink", SINK, "--requeue", "--dry-run", "--json")
    assert dry.code == 0, dry.err
    assert dry.json()["dry_run"] is True and dry.json()["requeued"] == rejected
    assert all(r[2] is None for r in letters(staging_url))  # a dry run changes nothing

    again = cli("dead-letters", "--sink", SINK, "--requeue")
    assert again.code == 0, again.err
    assert f"{rejected} dead letters of epochs 0-2 as correction c1" in again.out
    assert f"0 delivered, {rejected} rejected again" in again.out
    rows = letters(staging_url)
    assert [r for r in rows if r[0] >= 0] == [
        (e, "promote", -1) for e in range(3) for _ in range(3)
    ]
    assert [r for r in rows if r[0] < 0] == [(-1, "promote", None)] * rejected
    status = cli("status", "--sink", SINK, "--json").json()["sinks"][0]
    assert status["dead_letters"] == rejected and status["corrections"] == 1
    listing = cli("epochs", "--sink", SINK, "--json").json()["epochs"]
    assert [(e["epoch"], e["state"]) for e in listing][-1] == (-1, "COMMITTED")
    assert "c1" in cli("epochs", "--sink", SINK).out

    drop_conflicting(influx)
    fixed = cli("dead-letters", "--sink", SINK, "--requeue", "--reason", "field type conflict")
    assert fixed.code == 0, fixed.err
    assert f"{rejected} dead letters of epoch c1 as correction c2" in fixed.out
    assert held(influx, CONFLICTED) == expected(CONFLICTED)
    assert held(influx, GOOD) == expected(GOOD)
    assert cli("status", "--sink", SINK, "--json").json()["sinks"][0]["dead_letters"] == 0
    for selection in ([], ["--epoch", "1"], ["--epoch", "c2"], ["--from", "c2", "--to", "2"]):
        checked = cli("verify", "--sink", SINK, *selection)
        assert checked.code == 0, (selection, checked.out, checked.err)


def test_an_aborted_correction_gives_its_dead_letters_back(
    tp: TwoPhase, cli: Cli, staging_url: str, influx: TargetConfig
) -> None:
    rejected = rejected_store(tp, influx)
    drop_conflicting(influx)
    env = cli.env() | {"TWOPHASE_CRASH_AT": "after_decide"}
    assert cli.run("dead-letters", "--sink", SINK, "--requeue", env=env).code == -9
    assert {r[2] for r in letters(staging_url) if r[0] >= 0} == {-1}
    aborted = cli("abort", "--sink", SINK, "--epoch", "c1", "--yes")
    assert aborted.code == 0, aborted.err
    assert {r[2] for r in letters(staging_url)} == {None}
    again = cli("dead-letters", "--sink", SINK, "--requeue")
    assert f"{rejected} dead letters of epochs 0-2 as correction c2" in again.out, again.err
    assert held(influx, CONFLICTED) == expected(CONFLICTED)
    assert cli("verify", "--sink", SINK).code == 0
    counts = sql(
        staging_url,
        "SELECT corrections, points_requeued, epochs_aborted FROM twophase_sinks"
        " WHERE sink_id = %s",
        SINK,
    )
    assert counts == [(2, rejected, 1)]


def test_stage_time_dead_letters_are_not_requeued(
    tp: TwoPhase, cli: Cli, staging_url: str, influx: TargetConfig
) -> None:
    from twophase.points.builder import Rejected

    lease = begin_run(tp, SINK, "r1", "q1")
    rows: list[Any] = [*epoch_lines(0)[:2], Rejected(2, "field 'v' is null", '{"v": null}')]
    tp.committer.commit(lease, 0, stage(tp, SINK, 0, [rows]))
    tp.runs.end(SINK, "r1", "stopped")
    done = cli("dead-letters", "--sink", SINK, "--requeue")
    assert done.code == 0, done.err
    assert "1 rows rejected at staging are not requeued" in done.err
    assert f"no dead letters of sink {SINK!r} to requeue" in done.out


def test_requeue_refuses_a_live_run_and_bad_flags(
    tp: TwoPhase, cli: Cli, influx: TargetConfig
) -> None:
    rejected_store(tp, influx)
    begin_run(tp, SINK, "r2", "q1")  # a new run of the query, live
    refused = cli("dead-letters", "--sink", SINK, "--requeue")
    assert refused.code == 1 and "owned by run r2" in refused.one_line_error()
    usage = cli("dead-letters", "--sink", SINK, "--reason", "x")
    assert usage.code == 2 and "--requeue" in usage.one_line_error()


# Every step of a requeue: staged but not decided, the correction's decision written but
# not committed, decided, mid-promotion (the second of several requests), all sent but
# not marked, marked. The default run kills once before the decision (in_requeue) and
# at each step after it but one (after_promote, between the requests and the mark).
CRASH_STEPS = (
    pytest.param("after_stage", marks=pytest.mark.full),
    "in_requeue",
    "after_decide",
    "promote_batch:2",
    pytest.param("after_promote", marks=pytest.mark.full),
    "after_mark",
)
UNDECIDED = ("after_stage", "in_requeue")  # the letters are still the sink's to requeue


@pytest.mark.parametrize("crash_at", CRASH_STEPS)
def test_sigkill_at_each_step_of_a_requeue_then_recover(
    tp: TwoPhase, cli: Cli, staging_url: str, influx: TargetConfig, crash_at: str
) -> None:
    rejected = rejected_store(tp, influx)
    drop_conflicting(influx)
    env = cli.env() | {"TWOPHASE_CRASH_AT": crash_at, "TWOPHASE_TARGET_BATCH_POINTS": "2"}
    killed = cli.run("dead-letters", "--sink", SINK, "--requeue", env=env)
    assert killed.code == -9, (killed.code, killed.err)

    recovered = cli.run("recover", "--sink", SINK)
    assert recovered.code == 0, recovered.err
    again = cli.run("dead-letters", "--sink", SINK, "--requeue")
    assert again.code == 0, again.err
    decided_before_crash = crash_at not in UNDECIDED
    if decided_before_crash:
        assert f"no dead letters of sink {SINK!r} to requeue" in again.out
    else:
        assert f"{rejected} dead letters of epochs 0-2 as correction c1" in again.out

    assert held(influx, CONFLICTED) == expected(CONFLICTED)  # every point, once
    assert held(influx, GOOD) == expected(GOOD)
    assert {r[2] for r in letters(staging_url)} == {-1}  # all requeued, in c1, no c2
    states = sql(staging_url, "SELECT epoch, state FROM twophase_epochs WHERE epoch < 0")
    assert states == [(-1, "COMMITTED")]
    counts = sql(
        staging_url,
        "SELECT corrections, points_requeued, points_rejected_promote FROM twophase_sinks"
        " WHERE sink_id = %s",
        SINK,
    )
    assert counts == [(1, rejected, rejected)]
