"""``twophase targets remove``: a target the configuration no longer names, removed from its
sink on the real servers, so that GC compacts the sink's history past it.

Sink ``fan`` delivers to a and b (b through a fault proxy, :mod:`fanout_helpers`). b goes
down with a point it refused (its dead letter, requeued as correction c1 owed to b alone)
and a backlog; the query is restarted with a alone. A registered target holds the
compaction floor, quarantined or not, so GC past every retention compacts nothing and
the history grows with each epoch, until ``targets remove b``.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from devkit.faultproxy import CUT, PASS
from tests.integration.cli_helpers import BAD_POINT, Cli, make_cli, on_terminal, records, sql
from tests.integration.fanout_helpers import Pair, deliveries, target_rows, two_targets
from tests.staging import lines, stage
from tests.support import two_phase
from twophase.config import NamedTarget, StagingConfig, TargetConfig, TwoPhaseConfig
from twophase.model import EpochState, Lease
from twophase.operations import Guard, RequeueFilter, requeue
from twophase.operations.decommission import Removal, TargetRemoval
from twophase.protocol.commit.catchup import target_lock
from twophase.protocol.commit.runtime import TwoPhase
from twophase.protocol.maintain.gc import GarbageCollector
from twophase.store.locks import LockOwner

SINK = "fan"
N = 5  # points per epoch
LATER = 31 * 86400  # GC's clock past retention (7 days) and history_retention (30 days)
LETTERS = "SELECT target, epoch, requeued_in FROM twophase_dead_letters WHERE sink_id = %s"
CORRECTIONS = "SELECT epoch, target, state FROM twophase_epochs WHERE sink_id = %s AND epoch < 0"
REMOVE = ("targets", "remove", "b", "--sink", SINK)


@pytest.fixture
def pair(influx_url: str) -> Iterator[Pair]:
    with two_targets(influx_url) as pair:
        yield pair


def only_a(pair: Pair) -> TargetConfig:
    """The sink's configuration once b is taken out of it."""
    return dataclasses.replace(pair.config, targets=(NamedTarget("a", pair.a),))


def cli_for(staging_url: str, pair: Pair, *names: str) -> Cli:
    """``twophase`` with the configuration naming ``names`` (TWOPHASE_TARGETS)."""
    urls = {"a": pair.a.url, "b": pair.b.url}
    cli = make_cli(staging_url, pair.a)
    cli.flags = [
        *("--staging-url", staging_url, "--influx-api", "v1"),
        *("--targets", ",".join(f"{n}={urls[n]}" for n in names)),
        *("--influx-db", pair.a.influxdb.database or ""),
    ]
    return cli


def commit(tp: TwoPhase, lease: Lease, epoch: int, extra: tuple[str, ...] = ()) -> None:
    messages = stage(tp, SINK, epoch, [[*lines(epoch, N), *extra]], run=lease.run_id)
    assert tp.committer.commit(lease, epoch, messages).state == EpochState.COMMITTED


def collect(tp: TwoPhase) -> tuple[int, int | None]:
    """GC a month on, no lag allowed: (records compacted, the sink's floor)."""
    collector = GarbageCollector(tp.db, 7 * 86400, 3600, max_lag_s=0.0, history_s=30 * 86400)
    report = collector.collect(SINK, ahead_s=LATER)
    return report.epochs_compacted, report.compacted_through


def b_left_behind(staging: StagingConfig, pair: Pair) -> None:
    """Epoch 0 on both targets, each refusing one point (a dead letter each); b down for
    epochs 1-2, its letter requeued as c1 (owed to b alone: in b's backlog); then the
    query stopped and started again with a alone, b still down: epochs 3-5."""
    with two_phase(staging, pair.config) as fan:
        lease = fan.committer.claim(SINK, "r1", "q1")
        fan.catch_up.close()  # no catch-up worker: b stays behind
        commit(fan, lease, 0, (BAD_POINT,))
        pair.proxy.set_mode(CUT)
        for epoch in (1, 2):
            commit(fan, lease, epoch)
    done = requeue(
        TwoPhaseConfig(staging, pair.config),
        SINK,
        RequeueFilter(target="b"),
        guard=Guard(force=True),
    )
    assert done.corrections == (1,)
    with two_phase(staging, only_a(pair)) as job:
        lease = job.committer.claim(SINK, "r3", "q1")
        for epoch in (3, 4, 5):
            commit(job, lease, epoch)
        job.runs.end(SINK, "r3", "stopped")


@pytest.fixture
def behind(staging: StagingConfig, staging_url: str, pair: Pair) -> Pair:
    b_left_behind(staging, pair)
    assert sorted(sql(staging_url, LETTERS, SINK)) == [("a", 0, None), ("b", 0, -1)]
    assert sql(staging_url, CORRECTIONS, SINK) == [(-1, "b", "COMMITTED")]
    return pair


def test_a_removed_target_no_longer_holds_the_history_and_gc_compacts_past_it(
    staging: StagingConfig, staging_url: str, behind: Pair
) -> None:
    pair = behind
    with two_phase(staging, only_a(pair)) as job:
        # b is quarantined, yet its cursor (epoch 0) holds the floor: nothing is compacted,
        # and each epoch the query commits adds a record that stays.
        assert collect(job) == (0, 0)  # the floor passes epoch 0 only, which b holds
        lease = job.committer.claim(SINK, "r4", "q1")
        for epoch in (6, 7):
            commit(job, lease, epoch)
        job.runs.end(SINK, "r4", "stopped")
        assert collect(job) == (0, 0)
        assert records(staging_url, SINK)["epochs"] == [-1, *range(8)]
        assert target_rows(staging_url, SINK)["b"]["state"] == "quarantined"

        cli = cli_for(staging_url, pair, "a")
        done = cli(*REMOVE, "--yes", "--json")
        assert done.code == 0, done.err
        assert done.json() == {
            "sink_id": SINK,
            "target": "b",
            "state": "quarantined",
            "delivered_epoch": 0,
            "backlog_epochs": 7,  # 1-7: COMMITTED after its cursor, never delivered to it
            "backlog_corrections": 1,  # c1
            "backlog_bytes": 0,  # purged by the GC that quarantined it
            "deliveries": 1,  # epoch 0
            "dead_letters": 1,  # the point it refused in epoch 0 (requeued in c1)
            "corrections": [-1],
            "remaining": ["a"],
            "still_configured": False,
        }
        assert set(target_rows(staging_url, SINK)) == {"a"}
        assert deliveries(staging_url, SINK, "b") == []
        assert sql(staging_url, LETTERS, SINK) == [("a", 0, None)]  # a's letter stays
        assert sql(staging_url, CORRECTIONS, SINK) == []
        event = sql(
            staging_url,
            "SELECT run_id, detail FROM twophase_epoch_events WHERE event = 'target_removed'",
        )
        assert event[0][0].startswith("cli:") and event[0][1].startswith("b: was quarantined")

        # The floor passes what b lacked: every record below the last COMMITTED epoch
        # goes, but epoch 0's, which a's dead letter keeps.
        assert collect(job) == (6, 6)
        assert records(staging_url, SINK) == {
            "epochs": [0, 7],
            "writes": [0, 7],
            "events": [0, 7],
            "deliveries": [0, 7],  # a's of epoch 0, whose record stays
        }
        lease = job.committer.claim(SINK, "r5", "q1")
        for epoch in (8, 9):  # the history stays bounded as the query goes on
            commit(job, lease, epoch)
        assert collect(job) == (2, 8)
        assert records(staging_url, SINK)["epochs"] == [0, 9]


def test_targets_remove_refuses_what_it_should_and_asks_first(
    staging: StagingConfig, staging_url: str, behind: Pair
) -> None:
    pair = behind
    cli = cli_for(staging_url, pair, "a")
    before = target_rows(staging_url, SINK)
    unknown = cli("targets", "remove", "c", "--sink", SINK, "--yes")
    assert unknown.code == 2
    assert f"sink {SINK!r} has no target 'c' (its targets: a, b)" in unknown.one_line_error()
    configured = cli_for(staging_url, pair, "a", "b")(*REMOVE, "--yes")
    assert configured.code == 1
    assert "target 'b' is still named by this configuration" in configured.one_line_error()
    assert "or pass --force; nothing was removed" in configured.one_line_error()
    assert target_rows(staging_url, SINK) == before

    with two_phase(staging, only_a(pair)) as job:
        job.committer.claim(SINK, "r4", "q1")  # a live run owns the sink
        live = cli(*REMOVE, "--yes")
        assert live.code == 1 and "owned by run r4" in live.one_line_error()
        job.runs.end(SINK, "r4", "stopped")
    unasked = cli(*REMOVE)
    assert unasked.code == 2 and "pass --yes" in unasked.one_line_error()

    declined = on_terminal(cli, "n", *REMOVE)
    assert declined.returncode == 1, declined.stderr
    question = " ".join(declined.stderr.split())
    assert (
        f"Remove target 'b' of sink {SINK!r} (it is lagging, delivered up to epoch 0)? Deleted:"
        " its backlog of 5 COMMITTED epochs and 1 correction"
    ) in question, question
    assert "its 1 dead letter, no longer listed nor requeueable" in question, question
    assert "the corrections owed to it alone (c1)" in question, question
    assert "not confirmed; nothing was changed" in declined.stderr
    assert target_rows(staging_url, SINK) == before

    done = on_terminal(cli, "y", *REMOVE)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == (
        f"removed target 'b' from sink {SINK!r} (it was lagging, delivered up to 0); "
        "its targets now: a"
    )
    assert "1 dead letter, 1 delivery record, the corrections owed to it alone: c1" in done.stdout
    again = cli(*REMOVE, "--yes")
    assert again.code == 2 and "has no target 'b' (its targets: a)" in again.one_line_error()
    alone = cli("targets", "remove", "a", "--sink", SINK, "--yes", "--force")
    assert alone.code == 1
    assert "target 'a' is the last target of sink 'fan'" in alone.one_line_error()
    assert set(target_rows(staging_url, SINK)) == {"a"}


def test_what_the_other_commands_do_after_a_removal(
    staging: StagingConfig, staging_url: str, behind: Pair
) -> None:
    """recover and requeue leave the removed target alone, resend --target refuses it,
    and a run of the query that names it again registers it as a new target."""
    pair = behind
    both = cli_for(staging_url, pair, "a", "b")
    forced = both(*REMOVE, "--yes", "--force", "--json")  # still configured: forced
    assert forced.code == 0, forced.err
    assert forced.json()["still_configured"] is True
    assert "removing it because of --force" in forced.err

    recovered = both("recover", "--sink", SINK)
    assert recovered.code == 0, recovered.err
    assert recovered.out == "nothing to recover: no PRECOMMITTED epochs\n"  # b owed nothing
    assert set(target_rows(staging_url, SINK)) == {"a"}  # an operator's command adds none
    resend = both("resend", "--sink", SINK, "--epoch", "3", "--target", "b")
    assert resend.code == 2
    assert f"sink {SINK!r} has no target 'b' (its targets: a)" in resend.one_line_error()
    requeued = both("dead-letters", "--sink", SINK, "--requeue", "--target", "b")
    assert requeued.code == 0, requeued.err
    assert f"no dead letters of sink {SINK!r} to requeue" in requeued.out
    resync = both("targets", "resync", "b", "--sink", SINK, "--yes")
    assert resync.code == 2 and "has no target 'b'" in resync.one_line_error()

    pair.proxy.set_mode(PASS)
    with two_phase(staging, pair.config) as job:  # the query names b again
        lease = job.committer.claim(SINK, "r6", "q1")
        # a new target, owed the epochs from the next one on (as if added now)
        assert target_rows(staging_url, SINK)["b"] == {"state": "live", "delivered": 5, "from": 6}
        commit(job, lease, 6)
    assert target_rows(staging_url, SINK)["b"] == {"state": "live", "delivered": 6, "from": 6}
    assert deliveries(staging_url, SINK, "b") == [6]


def _snapshot(staging_url: str) -> list[Any]:
    """What a removal changes: the targets, deliveries, letters, corrections and their
    writes, the sink's retained bytes."""
    return [
        sql(staging_url, statement, SINK)
        for statement in (
            "SELECT target, state, delivered_epoch FROM twophase_targets WHERE sink_id = %s"
            " ORDER BY target",
            "SELECT target, epoch FROM twophase_target_deliveries WHERE sink_id = %s"
            " ORDER BY target, epoch",
            f"{LETTERS} ORDER BY id",
            f"{CORRECTIONS} ORDER BY epoch",
            "SELECT epoch, count(*) FROM twophase_writes WHERE sink_id = %s GROUP BY epoch"
            " ORDER BY epoch",
            "SELECT staged_bytes FROM twophase_sinks WHERE sink_id = %s",
        )
    ]


def test_sigkill_in_remove_then_again(staging_url: str, behind: Pair) -> None:
    """SIGKILLed inside its transaction, the removal leaves nothing of it; run again, it
    removes the target whole, once."""
    pair = behind
    cli = cli_for(staging_url, pair, "a")
    env = {k: v for k, v in cli.env().items() if k != "TWOPHASE_TARGET_URL"}
    env |= {
        "TWOPHASE_TARGETS": f"a={pair.a.url}",
        "TWOPHASE_INFLUX_DB": pair.a.influxdb.database or "",
    }
    before = _snapshot(staging_url)
    killed = cli.run(*REMOVE, "--yes", env=env | {"TWOPHASE_CRASH_AT": "in_remove"})
    assert killed.code == -9, (killed.code, killed.err)
    assert _snapshot(staging_url) == before  # nothing half done

    again = cli.run(*REMOVE, "--yes", "--json", env=env)
    assert again.code == 0, again.err
    report = again.json()
    assert (report["deliveries"], report["dead_letters"], report["corrections"]) == (1, 1, [-1])
    targets, delivered, letters, corrections, writes, _ = _snapshot(staging_url)
    assert [t[0] for t in targets] == ["a"]
    assert [d for d in delivered if d[0] == "b"] == []
    assert letters == [("a", 0, None)]
    assert corrections == [] and -1 not in [w[0] for w in writes]


def test_a_run_that_still_delivers_to_a_target_removed_under_it_leaves_it_out(
    staging: StagingConfig, staging_url: str, pair: Pair
) -> None:
    """Removed by ``--force`` while a live run delivers to it, the target is left out of
    that run's next commits (its delivery is not recorded: the target has no row), and
    the others commit the epochs; nothing registers it again until a run's claim."""
    with two_phase(staging, pair.config) as fan:
        lease = fan.committer.claim(SINK, "r1", "q1")
        commit(fan, lease, 0)  # both took it: the next epoch goes to both without a look
        removed = cli_for(staging_url, pair, "a", "b")(*REMOVE, "--yes", "--force")
        assert removed.code == 0, removed.err
        assert "owned by run r1" in removed.err and "because of --force" in removed.err
        for epoch in (1, 2):
            commit(fan, lease, epoch)
    assert target_rows(staging_url, SINK) == {"a": {"state": "live", "delivered": 2, "from": 0}}
    assert deliveries(staging_url, SINK, "a") == [0, 1, 2]
    assert deliveries(staging_url, SINK, "b") == []


def test_a_removal_waits_for_a_delivery_to_the_target_under_way(
    staging: StagingConfig, staging_url: str, behind: Pair
) -> None:
    """A catch-up holds the target's lock while it sends an epoch and records it: the
    removal waits for it, and goes ahead once it is released."""
    with two_phase(staging, only_a(behind)) as tp:
        [(token,)] = sql(staging_url, "SELECT fencing_token FROM twophase_sinks")
        outcome: list[Removal | BaseException] = []

        def remove() -> None:
            try:
                outcome.append(TargetRemoval(tp.db).remove(SINK, "b", "test"))
            except BaseException as exc:  # reported on the test's thread
                outcome.append(exc)

        with tp.db.session_lock(target_lock(SINK, "b"), LockOwner(SINK, token)):
            waiting = threading.Thread(target=remove)
            waiting.start()
            waiting.join(2.0)
            assert waiting.is_alive() and outcome == []
            assert "b" in target_rows(staging_url, SINK)
        waiting.join(30)
    assert [type(o) for o in outcome] == [Removal], outcome
    assert set(target_rows(staging_url, SINK)) == {"a"}
