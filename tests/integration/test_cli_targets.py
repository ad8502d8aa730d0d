"""The operator's view of a sink with two InfluxDB targets, on the real servers: status and
``targets`` with a lagging target, ``targets resync`` after a quarantine (naming the epochs GC
purged), ``verify --target`` and ``resend --target``, and the exporter's per-target series.

Target b is reached through a fault proxy (:mod:`tests.integration.fanout_helpers`): CUT
while committing leaves it lagging, as in test_fanout.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from devkit.faultproxy import CUT, PASS
from tests.integration.cli_helpers import Cli, make_cli, sql
from tests.integration.fanout_helpers import Pair, target_rows, two_targets
from tests.staging import M, lines, stage
from tests.support import NO_CACHE, influx_count, influx_query, scrape, two_phase, value
from twophase.config import StagingConfig, TargetConfig
from twophase.influx.query import query_v1
from twophase.model import EpochState, Lease
from twophase.operations import start_exporter
from twophase.operations.exporter import metric_names
from twophase.protocol.commit.runtime import TwoPhase
from twophase.protocol.maintain.gc import GarbageCollector

SINK = "fan"
N = 10  # points per epoch
WEEK = 8 * 86400  # GC's clock moved past the 7-day retention
TARGET_KEYS = {
    "target",
    "state",
    "delivered_epoch",
    "from_epoch",
    "lag_epochs",
    "lag_seconds",
    "lag_bytes",
    "first_missing",
    "lagging_since",
    "quarantined_at",
    "last_error",
    "url",
    "url_changed_at",
    "lag_corrections",
}


@pytest.fixture
def pair(influx_url: str) -> Iterator[Pair]:
    with two_targets(influx_url) as pair:
        yield pair


@pytest.fixture
def fan(staging: StagingConfig, pair: Pair) -> Iterator[TwoPhase]:
    with two_phase(staging, pair.config) as tp:
        yield tp


@pytest.fixture
def cli(staging_url: str, pair: Pair, monkeypatch: pytest.MonkeyPatch) -> Cli:
    """``twophase`` configured as the sink's job is: TWOPHASE_TARGETS a and b, b's own
    database in TWOPHASE_TARGET_B_INFLUX_DB."""
    monkeypatch.setenv("TWOPHASE_TARGET_B_INFLUX_DB", pair.b.influxdb.database or "")
    monkeypatch.setenv("TWOPHASE_TARGET_RETRY_DEADLINE", "20s")
    cli = make_cli(staging_url, pair.a)
    cli.flags = [
        *("--staging-url", staging_url, "--influx-api", "v1"),
        *(
            "--targets",
            f"a={pair.a.url},b={pair.b.url}",
            "--influx-db",
            pair.a.influxdb.database or "",
        ),
    ]
    return cli


def commit(tp: TwoPhase, lease: Lease, epoch: int) -> None:
    messages = stage(tp, lease.sink_id, epoch, [lines(epoch, N)], run=lease.run_id)
    assert tp.committer.commit(lease, epoch, messages).state == EpochState.COMMITTED


def b_behind(fan: TwoPhase, pair: Pair, epochs: range) -> Lease:
    """Commit ``epochs`` while b is down, with no catch-up: b lacks them (lagging)."""
    lease = fan.committer.claim(SINK, "r1", "q1")
    fan.catch_up.close()  # no catch-up worker: b stays behind
    pair.proxy.set_mode(CUT)
    for epoch in epochs:
        commit(fan, lease, epoch)
    pair.proxy.set_mode(PASS)
    return lease


def quarantine_and_purge(fan: TwoPhase) -> None:
    """GC a week on, with no lag allowed: b is quarantined and what it lacks is purged."""
    report = GarbageCollector(fan.db, 7 * 86400, 3600, max_lag_s=0.0).collect(SINK, ahead_s=WEEK)
    assert report.quarantined == ((SINK, "b"),)


def staged_bytes(staging_url: str, epochs: list[int]) -> int:
    rows = sql(
        staging_url,
        "SELECT sum(staged_bytes) FROM twophase_epochs WHERE sink_id = %s AND epoch = ANY(%s)",
        SINK,
        epochs,
    )
    return int(rows[0][0])


def ageless(target: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in target.items() if k not in ("sink_id", "lag_seconds")}


def drop(target: TargetConfig) -> None:
    query_v1(target.url, target.influxdb.database, f'DROP MEASUREMENT "{M}"', method="POST")


def test_status_and_targets_show_a_lagging_target(
    fan: TwoPhase, pair: Pair, cli: Cli, staging: StagingConfig, staging_url: str
) -> None:
    b_behind(fan, pair, range(2))
    with two_phase(staging, pair.a) as one:  # a sink with one target: no target rows
        commit(one, one.committer.claim("one", "r9", "q9"), 0)

    listed = cli("targets", "--json")
    assert listed.code == 0, listed.err
    a, b, one = listed.json()["targets"]  # by sink: "fan", then "one" (its one server)
    assert (one["sink_id"], one["target"], one["state"]) == ("one", "default", "live")
    assert set(a) == set(b) == TARGET_KEYS | {"sink_id"}
    assert (a["sink_id"], a["target"], a["state"], a["delivered_epoch"]) == (SINK, "a", "live", 1)
    assert (a["lag_epochs"], a["lag_seconds"], a["lag_bytes"]) == (0, None, 0)
    assert (b["target"], b["state"], b["delivered_epoch"], b["from_epoch"]) == (
        "b",
        "lagging",
        None,
        0,
    )
    assert (b["lag_epochs"], b["first_missing"]) == (2, 0)
    assert b["lag_bytes"] == staged_bytes(staging_url, [0, 1]) > 0
    assert b["lag_seconds"] >= 0 and b["lagging_since"].endswith("Z")
    assert b["quarantined_at"] is None and "TargetUnavailableError" in b["last_error"]

    sinks = {s["sink_id"]: s for s in cli("status", "--json").json()["sinks"]}
    shown = sinks[SINK]["targets"]
    assert [set(t) for t in shown] == [TARGET_KEYS, TARGET_KEYS]
    assert [ageless(t) for t in shown] == [ageless(t) for t in (a, b)]  # the lag grows
    assert [t["target"] for t in sinks["one"]["targets"]] == ["default"]  # the one server

    text = cli("status").out.splitlines()
    at = text.index(f"targets of sink {SINK!r}:")
    assert text[at + 1].split() == [
        "TARGET",
        "STATE",
        "DELIVERED",
        "LAG",
        "EPOCHS",
        "LAG",
        "LAG",
        "BYTES",
        "URL",
    ]
    assert text[at + 2].split()[:4] == ["a", "live", "1", "0"]
    assert text[at + 3].split()[:4] == ["b", "lagging", "-", "2"]
    assert "targets of sink 'one':" not in text  # its one target, live: not shown
    rows = cli("targets", "--sink", SINK).out.splitlines()
    assert rows[0].split()[:3] == ["SINK", "TARGET", "STATE"] and "LAST ERROR" in rows[0]
    assert rows[2].split()[:5] == [SINK, "b", "lagging", "-", "2"]
    of_one = cli("targets", "--sink", "one")
    assert of_one.code == 0 and of_one.out.splitlines()[1].split()[:3] == ["one", "default", "live"]

    lagging = cli("verify", "--sink", SINK, "--target", "b", "--json")
    assert lagging.code == 1  # b lacks the epochs: it differs, and says why
    report = lagging.json()
    assert report["target"] == "b" and report["ok"] is False
    assert "target 'b' is lagging: epochs 0-1 are not delivered to it yet" in report["notes"][0]


def test_resync_after_a_quarantine_names_the_epochs_gc_purged(
    fan: TwoPhase, pair: Pair, cli: Cli, staging_url: str
) -> None:
    lease = b_behind(fan, pair, range(2))
    quarantine_and_purge(fan)  # epochs 0-1: past retention, b quarantined, purged
    for epoch in (2, 3):  # b up again, but quarantined: left to the resync
        commit(fan, lease, epoch)
    assert influx_count(pair.b_direct, M) == 0
    (b,) = [t for t in cli("targets", "--json").json()["targets"] if t["target"] == "b"]
    assert (b["state"], b["lag_epochs"], b["first_missing"]) == ("quarantined", 4, 0)
    assert b["quarantined_at"].endswith("Z")

    live = cli("targets", "resync", "b", "--sink", SINK, "--yes")
    assert live.code == 1 and "owned by run r1" in live.one_line_error()
    fan.runs.end(SINK, "r1", "stopped")
    unasked = cli("targets", "resync", "b", "--sink", SINK)
    assert unasked.code == 2 and "pass --yes" in unasked.one_line_error()
    later = cli("targets", "resync", "b", "--sink", SINK, "--from-epoch", "2", "--yes")
    assert later.code == 2
    assert "would record epochs 0-1 as delivered without sending them" in later.one_line_error()
    assert target_rows(staging_url, SINK)["b"]["state"] == "quarantined"  # nothing changed

    done = cli("targets", "resync", "b", "--sink", SINK, "--yes", "--json")
    assert done.code == 0, done.err
    assert done.json() == {
        "sink_id": SINK,
        "target": "b",
        "from_epoch": 0,
        "delivered": [2, 3],
        "skipped_purged": [0, 1],
        "state": "live",
        "promoted": [],
        "compacted_through": None,  # b held the floor back: nothing compacted
    }
    assert influx_count(pair.b_direct, M) == 2 * N  # epochs 2 and 3
    assert target_rows(staging_url, SINK)["b"] == {"state": "live", "delivered": 3, "from": 0}
    assert cli("verify", "--sink", SINK, "--target", "b").code == 0  # 0-1: past retention

    again = cli("targets", "resync", "b", "--sink", SINK, "--yes")
    assert again.code == 0, again.err
    assert (
        again.out
        == f"target 'b' of sink {SINK!r} lacks no epoch staging could supply; it is live\n"
    )


def test_resync_from_an_epoch_re_delivers_what_a_target_lost(
    fan: TwoPhase, pair: Pair, cli: Cli, staging_url: str
) -> None:
    lease = fan.committer.claim(SINK, "r1", "q1")
    for epoch in range(3):
        commit(fan, lease, epoch)
    fan.runs.end(SINK, "r1", "stopped")
    drop(pair.b_direct)  # b's server lost its data; the store says it holds epochs 0-2
    assert cli("verify", "--sink", SINK, "--target", "b").code == 1
    beyond = cli("targets", "resync", "b", "--sink", SINK, "--from-epoch", "4", "--yes")
    assert beyond.code == 2 and "lacks the epochs from 3 on" in beyond.one_line_error()

    done = cli("targets", "resync", "b", "--sink", SINK, "--from-epoch", "0", "--yes")
    assert done.code == 0, done.err
    assert done.out.splitlines() == [
        f"re-delivered epochs 0-2 (3 epochs) to target 'b' of sink {SINK!r}, in epoch order from 0",
        f"target 'b' of sink {SINK!r} is live",
    ]
    assert influx_count(pair.b_direct, M) == 3 * N
    assert cli("verify", "--sink", SINK).code == 0
    unknown = cli("targets", "resync", "c", "--sink", SINK, "--yes")
    assert unknown.code == 2 and "unknown target 'c'" in unknown.one_line_error()
    cli.flags[cli.flags.index("--targets") + 1] += f",c={pair.a.url}/c"  # another server
    stranger = cli("targets", "resync", "c", "--sink", SINK, "--yes")
    assert stranger.code == 2
    assert f"sink {SINK!r} has no target 'c' (its targets: a, b)" in stranger.one_line_error()


def test_verify_and_resend_act_on_the_target_named(
    fan: TwoPhase, pair: Pair, cli: Cli, staging: StagingConfig
) -> None:
    only_a = dataclasses.replace(pair.config, targets=pair.config.targets[:1])
    with two_phase(staging, only_a) as one:  # epochs 0-1 before b was added
        lease = one.committer.claim(SINK, "r0", "q1")
        for epoch in range(2):
            commit(one, lease, epoch)
    lease = fan.committer.claim(SINK, "r1", "q1")
    for epoch in range(2, 4):
        commit(fan, lease, epoch)
    fan.runs.end(SINK, "r1", "stopped")

    both = cli("verify", "--sink", SINK)
    assert both.code == 0, both.out + both.err
    assert both.out.splitlines()[-1] == "OK: every target holds exactly the staged points (2)"
    in_a = cli("verify", "--sink", SINK, "--target", "a", "--json").json()
    assert (in_a["target"], in_a["ok"], in_a["epochs"]) == ("a", True, [0, 1, 2, 3])
    only_b = cli("verify", "--sink", SINK, "--target", "b", "--json").json()
    assert (only_b["ok"], only_b["epochs"]) == (True, [2, 3])  # owed from epoch 2 on
    assert only_b["notes"] == [
        "not verified: epochs 0-1 are older than target 'b', which is owed the epochs from 2 on"
    ]

    drop(pair.b_direct)
    assert cli("verify", "--sink", SINK, "--target", "a").code == 0
    lost = cli("verify", "--sink", SINK, "--target", "b")
    assert lost.code == 1
    assert lost.out.splitlines()[-1].startswith("DIFFERENCES in 3 series of target 'b'")
    per_target = cli("verify", "--sink", SINK, "--json")
    assert per_target.code == 1
    report = per_target.json()
    assert (report["sink_id"], report["ok"]) == (SINK, False)
    assert [(t["target"], t["ok"]) for t in report["targets"]] == [("a", True), ("b", False)]
    assert cli("verify", "--sink", SINK).out.splitlines()[-1] == "DIFFERENCES in 1 target: b"

    pair.proxy.reset_counts()
    to_a = cli("resend", "--sink", SINK, "--all", "--target", "a", "--json")
    assert to_a.code == 0, to_a.err
    assert to_a.json()["target"] == "a" and len(to_a.json()["resent"]) == 4
    assert pair.proxy.write_requests == 0 and influx_count(pair.b_direct, M) == 0  # b untouched
    to_b = cli("resend", "--sink", SINK, "--from", "2", "--target", "b")
    assert to_b.code == 0, to_b.err
    assert to_b.out.splitlines()[-1] == (
        f"re-sent {2 * N} points of 2 epochs of sink {SINK!r} to target 'b'"
    )
    assert pair.proxy.write_requests > 0 and influx_count(pair.b_direct, M) == 2 * N
    assert cli("verify", "--sink", SINK).code == 0
    pair.proxy.reset_counts()
    every = cli("resend", "--sink", SINK, "--epoch", "3")  # no --target: every target
    assert every.code == 0 and pair.proxy.write_requests > 0


def test_the_exporter_shows_each_target(fan: TwoPhase, pair: Pair, staging: StagingConfig) -> None:
    exporter = start_exporter(staging, port=0, live_window_s=600, exporter=NO_CACHE)
    try:
        b_behind(fan, pair, range(2))
        got = scrape(exporter.port)
        a, b = {"sink": SINK, "target": "a"}, {"sink": SINK, "target": "b"}
        assert value(got, "twophase_target_lag_epochs", **a) == 0
        assert value(got, "twophase_target_lag_epochs", **b) == 2
        assert value(got, "twophase_target_lag_seconds", **a) == 0
        assert value(got, "twophase_target_lag_seconds", **b) > 0
        assert value(got, "twophase_target_lag_bytes", **b) > 0
        assert value(got, "twophase_target_state", state="live", **a) == 1
        assert value(got, "twophase_target_state", state="lagging", **b) == 1
        assert value(got, "twophase_target_state", state="live", **b) == 0
        assert value(got, "twophase_target_delivered_epoch", **a) == 1
        assert ("twophase_target_delivered_epoch", tuple(sorted(b.items()))) not in got
        assert {name for name, _ in got} <= metric_names()
        quarantine_and_purge(fan)
        got = scrape(exporter.port)
        assert value(got, "twophase_target_state", state="quarantined", **b) == 1
        assert value(got, "twophase_target_state", state="lagging", **b) == 0
    finally:
        exporter.close()


def test_a_resend_never_puts_an_epoch_before_an_older_one_a_target_lacks(
    fan: TwoPhase, pair: Pair, cli: Cli
) -> None:
    lease = fan.committer.claim(SINK, "r1", "q1")
    fan.catch_up.close()  # no catch-up: b stays behind
    commit(fan, lease, 0)
    pair.proxy.set_mode(CUT)
    commit(fan, lease, 1)  # b is left without epoch 1
    pair.proxy.set_mode(PASS)
    fan.runs.end(SINK, "r1", "stopped")
    refused = cli("resend", "--sink", SINK, "--epoch", "1", "--target", "b")
    assert refused.code != 0 and "target 'b' still lacks epoch 1" in refused.err
    assert "nothing was sent" in refused.err
    every = cli("resend", "--sink", SINK, "--all")  # every target that holds each epoch
    assert every.code == 0, every.err
    assert influx_count(pair.b_direct, M) == N  # epoch 0 again, never epoch 1 first
    assert influx_count(pair.a, M) == 2 * N


def rewrites(epoch: int) -> list[str]:
    """N points that every epoch writes again (same keys and times), valued by epoch."""
    return [f"{M},host=a,n={i} v={epoch}.5 1700000000000000000" for i in range(N)]


def test_a_resend_that_fails_on_one_target_leaves_no_other_holding_an_older_value(
    fan: TwoPhase, pair: Pair, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    lease = fan.committer.claim(SINK, "r1", "q1")
    for epoch in range(2):  # epoch 1 rewrites epoch 0's points
        messages = stage(fan, SINK, epoch, [rewrites(epoch)], run="r1")
        assert fan.committer.commit(lease, epoch, messages).state == EpochState.COMMITTED
    fan.runs.end(SINK, "r1", "stopped")
    pair.proxy.set_mode(CUT)  # b goes down during the resend
    monkeypatch.setenv("TWOPHASE_TARGET_RETRY_DEADLINE", "2s")
    failed = cli("resend", "--sink", SINK, "--all")
    assert failed.code != 0
    pair.proxy.set_mode(PASS)
    for target in (pair.a, pair.b_direct):  # a re-sent whole (it comes first), b untouched
        assert rows(target) == {f"{i}": 1.5 for i in range(N)}
    events = "SELECT detail FROM twophase_epoch_events WHERE event = 'resent' ORDER BY epoch"
    assert [d for (d,) in sql(cli.staging_url, events)] == [
        f"re-sent {N} points, 0 rejected, to a"
    ] * 2  # the history names the target that took each epoch (b took none)


def rows(target: TargetConfig) -> dict[str, float]:
    series = influx_query(target, f'SELECT v FROM "{M}" GROUP BY n')  # noqa: S608
    return {s["tags"]["n"]: s["values"][0][1] for s in series}


def test_twophase_gc_quarantines_a_target_lagging_past_target_max_lag(
    fan: TwoPhase, pair: Pair, cli: Cli, staging_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    b_behind(fan, pair, range(2))
    kept = cli("gc", "--sink", SINK, "--retention", "0s", "--yes", "--json")  # 24 h allowed
    assert kept.code == 0, kept.err
    assert kept.json()["epochs_purged"] == 0  # b lacks both: held past retention
    assert target_rows(staging_url, SINK)["b"]["state"] == "lagging"
    monkeypatch.setenv("TWOPHASE_TARGET_MAX_LAG", "0s")
    done = cli("gc", "--sink", SINK, "--retention", "0s", "--yes")
    assert done.code == 0, done.err
    assert f"target b of sink {SINK} quarantined" in done.out
    assert "gc purged 2 epochs" in done.out
    assert target_rows(staging_url, SINK)["b"]["state"] == "quarantined"


def test_recover_exits_1_naming_a_target_it_could_not_catch_up(
    fan: TwoPhase, pair: Pair, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    b_behind(fan, pair, range(2))
    pair.proxy.set_mode(CUT)  # b still down
    monkeypatch.setenv("TWOPHASE_TARGET_RETRY_DEADLINE", "2s")
    done = cli("recover", "--sink", SINK, "--force")
    assert done.code == 1
    assert f"sink {SINK}: target b is still behind" in done.err
    pair.proxy.set_mode(PASS)
    assert cli("recover", "--sink", SINK, "--force").code == 0
