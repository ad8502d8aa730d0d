"""abort, reset and gc: confirmation, refusal without a terminal, and what they change."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.integration.cli_helpers import (
    OTHER,
    SINK,
    Cli,
    Result,
    known_store,
    make_cli,
    make_idle,
    on_terminal,
    sql,
)
from tests.staging import M, lines, stage
from tests.support import begin_run, influx_rows
from twophase.config import TargetConfig
from twophase.influx.query import query_v1
from twophase.model import EpochState
from twophase.points.builder import Rejected
from twophase.protocol.commit.runtime import TwoPhase


@pytest.fixture
def cli(tp: TwoPhase, staging_url: str, influx: TargetConfig) -> Cli:
    known_store(tp)
    return make_cli(staging_url, influx)


def state(staging_url: str, epoch: int, sink: str = SINK) -> str:
    found = sql(
        staging_url,
        "SELECT state FROM twophase_epochs WHERE sink_id = %s AND epoch = %s",
        sink,
        epoch,
    )
    return str(found[0][0]) if found else "gone"


@pytest.mark.parametrize(
    "args",
    [
        ["abort", "--sink", SINK, "--epoch", "3"],
        ["reset", "--sink", OTHER],
        ["gc", "--retention", "0s"],
    ],
)
def test_destructive_commands_refuse_without_yes_off_a_terminal(
    cli: Cli, staging_url: str, args: list[str]
) -> None:
    make_idle(staging_url, SINK)
    make_idle(staging_url, OTHER)
    before = sql(staging_url, "SELECT sink_id, epoch, state, purged_at FROM twophase_epochs")
    result = cli.run(*args)  # a subprocess whose stdin is a pipe
    assert result.code == 2
    assert "stdin is not a terminal: pass --yes" in result.one_line_error()
    assert sql(staging_url, "SELECT sink_id, epoch, state, purged_at FROM twophase_epochs") == (
        before
    )


def test_abort_with_confirmation_on_a_terminal(cli: Cli, staging_url: str) -> None:
    make_idle(staging_url)
    declined = on_terminal(cli, "n", "abort", "--sink", SINK, "--epoch", "3")
    assert declined.returncode == 1, declined.stderr
    assert "Abort epoch 3 of sink 's'? Its 10 staged points are deleted" in declined.stderr
    assert "not confirmed; nothing was changed" in declined.stderr
    assert state(staging_url, 3) == "PRECOMMITTED"

    done = on_terminal(cli, "y", "abort", "--sink", SINK, "--epoch", "3", "--reason", "bad feed")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "aborted epoch 3 of sink 's': 10 staged points discarded (bad feed)\n"
    assert state(staging_url, 3) == "ABORTED"
    event = sql(
        staging_url,
        "SELECT run_id, detail FROM twophase_epoch_events WHERE event = 'aborted' AND epoch = 3",
    )
    assert event[0][0].startswith("cli:") and event[0][1] == "bad feed"


def test_abort_checks(cli: Cli, staging_url: str) -> None:
    live = cli("abort", "--sink", SINK, "--epoch", "3", "--yes")
    assert live.code == 1 and "owned by run r1" in live.one_line_error()
    make_idle(staging_url)
    committed = cli("abort", "--sink", SINK, "--epoch", "1", "--yes")
    assert committed.code == 1
    assert "epoch 1 is COMMITTED: only a PRECOMMITTED epoch can be aborted" in (
        committed.one_line_error()
    )
    assert cli("abort", "--sink", SINK, "--epoch", "42", "--yes").code == 2
    assert cli("abort", "--sink", SINK, "--yes").code == 2  # --epoch is required
    result = cli("abort", "--sink", SINK, "--epoch", "3", "--yes", "--json")
    assert result.code == 0, result.err
    assert result.json() == {
        "sink_id": SINK,
        "epoch": 3,
        "state": "ABORTED",
        "reason": "aborted by an operator",
        "points_discarded": 10,
    }
    staged = sql(
        staging_url,
        "SELECT count(*) FROM twophase_staged_chunks p JOIN twophase_epochs e"
        " ON p.write_id = ANY(e.write_ids) WHERE e.epoch = 3 AND e.sink_id = 's'",
    )
    assert staged == [(0,)]


def test_reset_is_the_way_out_of_a_checkpoint_reset(
    tp: TwoPhase, cli: Cli, staging_url: str
) -> None:
    make_idle(staging_url)
    pending = cli("reset", "--sink", SINK, "--yes")
    assert pending.code == 1
    assert "run `twophase recover --sink s` before resetting it" in the_error(pending)
    assert cli("recover", "--sink", SINK).code == 0
    done = cli("reset", "--sink", SINK, "--yes", "--json")
    assert done.code == 0, done.err
    assert done.json() == {
        "sink_id": SINK,
        "query_id": "q1",
        "epochs_forgotten": 4,
        "dead_letters_kept": 2,  # epoch 1's row rejected at staging, epoch 2's refused point
    }
    # the reset checkpoint's new query starts again at epoch 0
    lease = begin_run(tp, SINK, "r5", "q-new")
    outcome = tp.committer.commit(lease, 0, stage(tp, SINK, 0, [lines(0, 2, host="z")]))
    assert (outcome.state, outcome.replay) == (EpochState.COMMITTED, False)
    assert cli("reset", "--sink", "nope", "--yes").code == 2


# The warnings a failed command may print beside its error line. The console's, once:
# the in-process ``cli`` passes the staging URL, password included, as a flag. The
# staging retry logger's (twophase.retry), any number: a step the store failed for a
# moment (a lock wait, a connection lost under load) and that was repeated; they
# change nothing about the command's outcome.
PASSWORD_WARNING = "twophase: warning: the password in --staging-url is visible to other users"
RETRY_WARNING = re.compile(
    r"twophase: warning: .+ failed \(attempt \d+\); retrying in \d+\.\d{2}s: .+"
)


def the_error(result: Result) -> str:
    """The error line of a failed command's stderr: exactly one, no traceback, and no
    other line but the password warning (once) and the retry logger's warnings."""
    assert "Traceback" not in result.err, result.err
    lines = result.err.splitlines()
    errors = [line for line in lines if line.startswith("twophase: error: ")]
    password = [line for line in lines if line.startswith(PASSWORD_WARNING)]
    retries = [line for line in lines if RETRY_WARNING.fullmatch(line)]
    assert len(errors) == 1 and len(password) <= 1, result.err
    assert len(errors) + len(password) + len(retries) == len(lines), result.err
    return errors[0]


def dead_letters_of(staging_url: str, sink: str = SINK) -> list[tuple[Any, ...]]:
    return sql(
        staging_url,
        "SELECT epoch, phase, requeued_in FROM twophase_dead_letters WHERE sink_id = %s"
        " ORDER BY id",
        sink,
    )


def test_a_reset_and_the_gc_after_it_keep_the_dead_letters_of_decided_writes(
    tp: TwoPhase, cli: Cli, staging_url: str, influx: TargetConfig
) -> None:
    """A reset forgets the epochs, which makes every write an orphan; the gc past the
    orphan grace removes them, but the dead letters of the writes the epochs had chosen
    stay the sink's: listed, and requeued once the cause is fixed. Dead letters of
    writes no epoch chose (failed task attempts) go with their writes."""
    make_idle(staging_url)
    assert cli("recover", "--sink", SINK).code == 0  # epoch 3: a reset needs none pending
    # Orphans with rows rejected at staging: a failed attempt of decided epoch 1, and a
    # crashed run's attempt of epoch 4, never decided.
    for epoch in (1, 4):
        orphan: list[Any] = [*lines(epoch, 2, host="o"), Rejected(2, "bad row", '{"v": 1}')]
        stage(tp, SINK, epoch, [orphan], attempt=1)
    assert len(dead_letters_of(staging_url)) == 4
    decided = [(1, "stage", None), (2, "promote", None)]

    asked = on_terminal(cli, "n", "reset", "--sink", SINK)
    assert asked.returncode == 1, asked.stderr
    question = " ".join(asked.stderr.split())
    assert "Deleted: its 4 epoch records now" in question, question
    assert "with the dead letters of writes no epoch chose (2)" in question, question
    assert "Kept: its 2 dead letters of decided writes" in question, question
    done = cli("reset", "--sink", SINK, "--yes")
    assert done.code == 0, done.err
    assert "forgot 4 epochs, kept 2 dead letters" in done.out

    # The reset checkpoint's new query decides epochs 0-2 again: the old writes of those
    # epochs are orphans at once, the others past the grace.
    lease = begin_run(tp, SINK, "r5", "q-new")
    for epoch in range(3):
        tp.committer.commit(lease, epoch, stage(tp, SINK, epoch, [lines(epoch, 2, host="n")]))
    tp.runs.end(SINK, "r5", "stopped")
    swept = cli("gc", "--sink", SINK, "--orphan-grace", "0s", "--yes", "--json")
    assert swept.code == 0, swept.err
    assert swept.json()["orphan_writes"] == 2 * 3 + 1 + 2  # the old epochs 0-3, the orphans
    assert sql(staging_url, "SELECT count(*) FROM twophase_writes WHERE sink_id = %s", SINK) == [
        (3,)
    ]
    assert dead_letters_of(staging_url) == decided  # the orphans' letters went

    listed = cli("dead-letters", "--sink", SINK, "--json")
    assert listed.code == 0, listed.err
    assert [(d["epoch"], d["phase"]) for d in listed.json()["dead_letters"]] == [
        (1, "stage"),
        (2, "promote"),
    ]
    assert cli("status", "--sink", SINK, "--json").json()["sinks"][0]["dead_letters"] == 2

    # The cause fixed (the measurement whose field type refused the point dropped), the
    # kept promote-time letter is requeued as the sink's first correction, once.
    query_v1(influx.url, influx.influxdb.database, f'DROP MEASUREMENT "{M}"', method="POST")
    requeued = cli("dead-letters", "--sink", SINK, "--requeue")
    assert requeued.code == 0, requeued.err
    assert "requeued 1 dead letter of epoch 2 as correction c1: 1 delivered" in requeued.out
    assert "1 rows rejected at staging are not requeued" in requeued.err
    assert dead_letters_of(staging_url) == [(1, "stage", None), (2, "promote", -1)]
    assert [dict(fields)["v"] for _, _, fields in influx_rows(influx, M)] == ["not a float"]
    assert cli("gc", "--sink", SINK, "--orphan-grace", "0s", "--yes").code == 0
    assert len(dead_letters_of(staging_url)) == 2


def test_gc_dry_run_then_for_real(cli: Cli, staging_url: str) -> None:
    dry = cli("gc", "--retention", "0s", "--json", "--dry-run")  # no --yes needed
    assert dry.code == 0, dry.err
    report = dry.json()
    assert (report["dry_run"], report["epochs_purged"], report["points_purged"]) == (True, 4, 36)
    assert {s["sink_id"] for s in report["sinks"]} == {SINK, OTHER}
    assert set(report) == {
        "dry_run",
        "retention_s",
        "orphan_grace_s",
        "epochs_purged",
        "points_purged",
        "orphan_writes",
        "epochs_compacted",
        "history_retention_s",
        "sinks",
    }
    assert sql(staging_url, "SELECT count(*) FROM twophase_epochs WHERE purged_at IS NOT NULL") == [
        (0,)
    ]
    done = cli("gc", "--sink", SINK, "--retention", "0s", "--yes")
    assert done.code == 0, done.err
    assert done.out.splitlines()[-1] == (
        "gc purged 3 epochs (31 staged points) past retention 0s and 0 orphaned writes"
    )
    assert "gc: 1/1 sinks s (100%)" in done.err
    assert state(staging_url, 3) == "PRECOMMITTED"  # never purged: not delivered yet
    resend = cli("resend", "--sink", SINK, "--epoch", "1")
    assert resend.code == 1 and "epoch 1 is past retention" in resend.one_line_error()
    bad = cli("gc", "--retention", "7x")
    assert bad.code == 2
    assert "argument --retention: '7x' is not a duration" in bad.one_line_error()


def _store_snapshot(staging_url: str) -> list[Any]:
    """What gc and reset change: epochs (state, purge), writes, staged points, dead
    letters (and whether a reset kept them), the sink rows."""
    return [
        sql(staging_url, statement)
        for statement in (
            "SELECT sink_id, epoch, state, purged_at IS NULL FROM twophase_epochs"
            " ORDER BY sink_id, epoch",
            "SELECT write_id FROM twophase_writes ORDER BY write_id",
            "SELECT write_id, count(*) FROM twophase_staged_chunks GROUP BY write_id"
            " ORDER BY write_id",
            "SELECT id, reset_at IS NULL FROM twophase_dead_letters ORDER BY id",
            "SELECT sink_id, query_id, fencing_token, staged_bytes FROM twophase_sinks"
            " ORDER BY sink_id",
        )
    ]


# Each command's transaction killed after its deletes, before its COMMIT: gc's purge
# (its first transaction), gc's removal of orphans (its second, the purge committed),
# reset's one.
GC = ["gc", "--sink", SINK, "--retention", "0s", "--orphan-grace", "0s", "--yes"]
KILLED_COMMANDS = {"in_gc:1": GC, "in_gc:2": GC, "in_reset": ["reset", "--sink", SINK, "--yes"]}
PURGED = "SELECT count(*) FROM twophase_epochs WHERE sink_id = %s AND purged_at IS NOT NULL"


@pytest.mark.parametrize("point", sorted(KILLED_COMMANDS))
def test_sigkill_in_gc_and_reset_then_again(
    tp: TwoPhase, cli: Cli, staging_url: str, point: str
) -> None:
    """SIGKILLed inside a transaction, gc or reset leaves nothing of it; run again, it
    does what is left once: the purge and the orphan's removal, or the forgotten epochs
    with their decided writes' dead letters kept."""
    make_idle(staging_url)
    assert cli("recover", "--sink", SINK).code == 0  # epoch 3 delivered: nothing pending
    orphan: list[Any] = [*lines(4, 2, host="o"), Rejected(2, "bad row", '{"v": 1}')]
    stage(tp, SINK, 4, [orphan], attempt=1)  # a crashed run's attempt, never decided
    before = _store_snapshot(staging_url)
    command = KILLED_COMMANDS[point]
    killed = cli.run(*command, env=cli.env() | {"TWOPHASE_CRASH_AT": point})
    assert killed.code == -9, (killed.code, killed.err)
    after = _store_snapshot(staging_url)
    if point == "in_gc:2":  # the purge committed, the orphan's removal undone
        assert sql(staging_url, PURGED, SINK) == [(4,)]
        assert (after[1], after[3]) == (before[1], before[3])  # writes, dead letters
    else:
        assert after == before  # nothing half done

    again = cli(*command, "--json")
    assert again.code == 0, again.err
    if point.startswith("in_gc"):
        purged = 0 if point == "in_gc:2" else 4
        assert (again.json()["epochs_purged"], again.json()["orphan_writes"]) == (purged, 1)
        assert sql(staging_url, PURGED, SINK) == [(4,)]
        assert len(dead_letters_of(staging_url)) == 2  # the orphan's letter went with it
    else:
        assert again.json()["epochs_forgotten"] == 4
        assert state(staging_url, 0) == "gone"
        kept = sql(
            staging_url, "SELECT count(*) FROM twophase_dead_letters WHERE reset_at IS NOT NULL"
        )
        assert kept == [(2,)]  # the decided writes' letters, kept for the sink
