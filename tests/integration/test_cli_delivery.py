"""recover, resend and verify against the real servers; the end-to-end ones run the
installed ``twophase`` console script as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devkit.ports import free_port
from tests.integration.cli_helpers import (
    SCRIPT,
    SINK,
    Cli,
    M,
    known_store,
    make_cli,
    make_idle,
    sql,
)
from tests.integration.crash_driver import MEASUREMENT, PARTITIONS, POINTS_PER_PARTITION
from tests.staging import lines, stage
from tests.support import REPO, begin_run, influx_count, influx_rows
from twophase.config import TargetConfig
from twophase.errors import FencedError
from twophase.influx.query import query_v1
from twophase.protocol.commit.runtime import TwoPhase


@pytest.fixture
def cli(staging_url: str, influx: TargetConfig) -> Cli:
    return make_cli(staging_url, influx)


def states(staging_url: str, sink: str = SINK) -> dict[int, str]:
    rows = sql(staging_url, "SELECT epoch, state FROM twophase_epochs WHERE sink_id = %s", sink)
    return dict(rows)  # type: ignore[arg-type]


def test_recover_is_refused_while_a_live_run_owns_the_sink(
    tp: TwoPhase, cli: Cli, staging_url: str
) -> None:
    known_store(tp)
    token = sql(staging_url, "SELECT fencing_token FROM twophase_sinks WHERE sink_id = 's'")
    refused = cli("recover", "--sink", SINK)
    assert refused.code == 1
    line = refused.one_line_error()
    assert "owned by run r1" in line and "--force" in line
    assert states(staging_url)[3] == "PRECOMMITTED"
    assert sql(staging_url, "SELECT fencing_token FROM twophase_sinks WHERE sink_id = 's'") == token


def test_recover_promotes_in_order_and_reports(tp: TwoPhase, cli: Cli, staging_url: str) -> None:
    known_store(tp)
    make_idle(staging_url)
    before = influx_count(tp.config.target, M)
    result = cli("recover", "--json")
    assert result.code == 0, result.err
    assert result.json() == {
        "recovered": [{"sink_id": SINK, "epoch": 3, "delivered": 10, "rejected": 0}],
        "caught_up": [],  # its one target is live: no backlog to catch up
        "still_behind": [],
    }
    assert "recover: 10/10 points s#3 (100%)" in result.err  # plain progress lines off a terminal
    assert "PRECOMMITTED" not in states(staging_url).values()
    assert influx_count(tp.config.target, M) == before + 10
    owner = sql(staging_url, "SELECT owner_run_id FROM twophase_sinks WHERE sink_id = 's'")
    assert owner[0][0].startswith("cli-")
    assert cli("status", "--json").json()["sinks"][0]["owner_live"] is False  # the CLI's own run
    again = cli("recover")
    assert again.code == 0 and again.out == "nothing to recover: no PRECOMMITTED epochs\n"


def test_recover_force_fences_the_live_run(tp: TwoPhase, cli: Cli, staging_url: str) -> None:
    known_store(tp)
    lease = begin_run(tp, SINK, "r1", "q1")  # the same live run's lease
    forced = cli("recover", "--sink", SINK, "--force")
    assert forced.code == 0, forced.err
    assert "going ahead because of --force" in forced.err
    with pytest.raises(FencedError):
        tp.ledger.decide(lease, 4, stage(tp, SINK, 4, [lines(4, 2)]))


def test_recover_after_a_driver_crash_end_to_end(
    cli: Cli, staging_url: str, influx: TargetConfig, tmp_path: Path
) -> None:
    """A real driver process SIGKILLed half-way through promoting epoch 1 (decided,
    partly sent); `twophase recover` completes it: no PRECOMMITTED epoch is left and
    InfluxDB holds exactly the decided epochs' points."""
    env = {k: v for k, v in os.environ.items() if k != "TWOPHASE_CRASH_AT"}
    env["TWOPHASE_CRASH_AT"] = "promote_batch:11"  # 9 requests per epoch: epoch 1, 2 sent
    driver = subprocess.run(
        [
            *(sys.executable, "-m", "tests.integration.crash_driver"),
            *("--staging-url", staging_url, "--influx-url", influx.url),
            *("--influx-db", influx.influxdb.database or "", "--sink", SINK, "--epochs", "3"),
            *("--spark-log", str(tmp_path / "log"), "--run-id", "run-1"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert driver.returncode == -9, driver.stderr
    assert states(staging_url) == {0: "COMMITTED", 1: "PRECOMMITTED"}
    partial = influx_count(influx, MEASUREMENT)
    assert PARTITIONS * POINTS_PER_PARTITION < partial < 2 * PARTITIONS * POINTS_PER_PARTITION

    refused = cli.run("recover")  # the dead driver touched the sink a moment ago
    assert refused.code == 1 and "--force" in refused.one_line_error()
    done = cli.run("recover", "--force")
    assert done.code == 0, done.err
    assert done.out.splitlines()[1].split() == [SINK, "1", "300", "1"]  # one point rejected
    assert "recovered 1 epoch; no PRECOMMITTED epoch is left" in done.out
    assert states(staging_url) == {0: "COMMITTED", 1: "COMMITTED"}
    assert influx_count(influx, MEASUREMENT) == 2 * PARTITIONS * POINTS_PER_PARTITION
    check = cli.run("verify", "--sink", SINK)
    assert check.code == 0, check.out + check.err
    assert "OK: the target holds exactly the staged points" in check.out


def test_resend_restores_a_dropped_measurement_end_to_end(tp: TwoPhase, cli: Cli) -> None:
    known_store(tp)
    tp.committer.recover(begin_run(tp, SINK, "r2", "q1"))
    committed = influx_rows(tp.config.target, M)
    assert len(committed) == 45  # 4 epochs x 10 of s (one rejected), 5 of t

    ok = cli.run("verify", "--sink", SINK)
    assert ok.code == 0, ok.out + ok.err
    assert ok.out.splitlines()[-1] == (
        "OK: the target holds exactly the staged points "
        "(sink 's', epochs 0-3: 40 points in 3 series)"
    )

    config = tp.config.target
    query_v1(config.url, config.influxdb.database, f'DROP MEASUREMENT "{M}"', method="POST")
    lost = cli.run("verify", "--sink", SINK, "--json")
    assert lost.code == 1
    report = lost.json()
    assert report["ok"] is False and report["points"] == 40
    assert sorted((d["tags"]["n"], d["missing"]) for d in report["differences"]) == [
        ("0", 16),
        ("1", 12),
        ("2", 12),
    ]
    assert (
        cli.run("verify", "--sink", SINK).out.splitlines()[-1].startswith("DIFFERENCES in 3 series")
    )

    make_idle(cli.staging_url)  # the query was stopped for the repair
    # Killed after epoch 2's request (one per epoch), whose rejection it recorded: the
    # operator runs it again, which re-sends every epoch once more.
    crash = {"TWOPHASE_CRASH_AT": "promote_batch:3"}
    killed = cli.run("resend", "--sink", SINK, "--all", env=cli.env() | crash)
    assert killed.code == -9, (killed.code, killed.err)
    assert len(influx_rows(tp.config.target, M)) == 30  # epochs 0-2 (epoch 3 not yet)
    resent = cli.run("resend", "--sink", SINK, "--all", "--json")
    assert resent.code == 0, resent.err
    assert resent.json() == {
        "sink_id": SINK,
        "resent": [
            {"sink_id": SINK, "epoch": 0, "points_sent": 10, "points_rejected": 0},
            {"sink_id": SINK, "epoch": 1, "points_sent": 10, "points_rejected": 0},
            {"sink_id": SINK, "epoch": 2, "points_sent": 10, "points_rejected": 1},
            {"sink_id": SINK, "epoch": 3, "points_sent": 10, "points_rejected": 0},
        ],
        "skipped_aborted": [],
        "skipped_purged": [],
    }
    assert "resend: 41/41 points (100%)" in resent.err
    sink_t = [r for r in committed if ("host", "t") in r[1]]
    assert influx_rows(tp.config.target, M) == [r for r in committed if r not in sink_t]
    assert cli.run("verify", "--sink", SINK).code == 0
    events = sql(
        cli.staging_url, "SELECT count(*) FROM twophase_epoch_events WHERE event = 'resent'"
    )
    assert events == [(2 + 4,)]  # those the killed resend finished, then all four
    letters = sql(cli.staging_url, "SELECT epoch, phase FROM twophase_dead_letters")
    assert sorted(letters) == [(1, "stage"), (2, "promote")]  # each rejection once


def test_a_query_that_claims_the_sink_stops_a_resend(
    tp: TwoPhase, cli: Cli, tmp_path: Path
) -> None:
    """A resend runs under a lease of its own: the query restarted meanwhile claims the
    sink, and the resend sends no request more, so an old value it would re-send can
    never land after the query's newer one."""
    known_store(tp)
    tp.committer.recover(begin_run(tp, SINK, "r2", "q1"))
    config = tp.config.target
    query_v1(config.url, config.influxdb.database, f'DROP MEASUREMENT "{M}"', method="POST")
    make_idle(cli.staging_url)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"at": "promote_batch:1", "pause_s": 5}))
    env = cli.env() | {
        "TWOPHASE_CRASH_PLAN": str(plan),
        "TWOPHASE_TARGET_BATCH_POINTS": "5",
        # One connection: the pause holds every request, so none lands between the
        # count below and the claim (other lanes would go on sending until it).
        "TWOPHASE_PROMOTE_CONNECTIONS": "1",
    }
    resend = subprocess.Popen(
        [str(SCRIPT), "resend", "--sink", SINK, "--all"],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    fired = plan.with_name(plan.name + ".fired")
    deadline = time.monotonic() + 60
    while not fired.exists():  # its first request sent, the resend pauses
        assert resend.poll() is None and time.monotonic() < deadline, resend.communicate()
        time.sleep(0.05)
    sent = len(influx_rows(config, M))  # its first request's points
    begin_run(tp, SINK, "r3", "q1")  # the query, restarted, claims the sink
    _, err = resend.communicate(timeout=60)
    assert resend.returncode == 1, err
    assert "was fenced by a newer run (r3)" in err, err
    assert 0 < sent < 40 and len(influx_rows(config, M)) == sent  # no request after it


def test_resend_refuses_what_it_cannot_send(tp: TwoPhase, cli: Cli, staging_url: str) -> None:
    known_store(tp)
    make_idle(staging_url)
    pending = cli("resend", "--sink", SINK, "--from", "2")
    assert pending.code == 1 and "epoch 3 is PRECOMMITTED" in pending.one_line_error()
    assert cli("resend", "--sink", SINK).code == 2  # no epochs chosen
    assert cli("resend", "--sink", SINK, "--epoch", "7").code == 2
    live = cli("resend", "--sink", "t", "--all")
    assert live.code == 1 and "owned by run r9" in live.one_line_error()

    sql(staging_url, "UPDATE twophase_epochs SET purged_at = now() WHERE epoch IN (0, 1)")
    purged = cli("resend", "--sink", SINK, "--from", "0", "--to", "2")
    assert purged.code == 1
    assert "epochs 0-1 are past retention" in purged.one_line_error()
    assert sql(staging_url, "SELECT count(*) FROM twophase_epoch_events WHERE event = 'resent'")[
        0
    ] == (0,)
    older = cli("resend", "--sink", SINK, "--epoch", "2")
    assert older.code == 0, older.err
    assert "not re-sent" not in older.err  # epoch 3 is not COMMITTED: nothing later


def test_verify_reports_changed_and_extra_points(tp: TwoPhase, cli: Cli) -> None:
    known_store(tp)
    config = tp.config.target
    base = 1_700_000_000_000_000_000
    body = f"{M},host=a,n=1 v=99 {base + 1}\n{M},host=a,n=1 v=5 {base + 2 * 10**12 + 2}"
    next(iter(tp.deliveries.values()))._sender.send(body.encode(), 2, body.splitlines)
    result = cli("verify", "--sink", SINK, "--json")
    assert result.code == 1
    (diff,) = result.json()["differences"]
    assert (diff["tags"], diff["different"], diff["extra"], diff["missing"]) == (
        {"host": "a", "n": "1"},
        1,
        1,
        0,
    )
    assert diff["examples"][0] == (
        "2023-11-14T22:13:20.000000001Z: field 'v' expected 1.0, the target has 99"
    )
    notes = result.json()["notes"]
    assert notes == [
        "not verified: epoch 3 is PRECOMMITTED (not delivered yet; run `twophase recover`)"
    ]
    assert config.influxdb.database  # the per-test database, not the shared one


def test_verify_of_an_old_epoch_accounts_for_later_rewrites(tp: TwoPhase, cli: Cli) -> None:
    """Update output mode: epoch 1 rewrites epoch 0's points; verifying epoch 0 alone
    expects the newer values InfluxDB rightly holds."""
    lease = begin_run(tp, SINK, "r1", "q1")
    tp.committer.commit(lease, 0, stage(tp, SINK, 0, [lines(0, 6)]))
    tp.committer.commit(lease, 1, stage(tp, SINK, 1, [lines(0, 3, value_offset=0.5)]))
    assert cli("verify", "--sink", SINK, "--epoch", "0").code == 0
    assert cli("verify", "--sink", SINK).code == 0
    resend_old = cli("resend", "--sink", SINK, "--epoch", "0", "--force")
    assert resend_old.code == 0
    assert "epochs after 0 (up to 1) are not re-sent" in resend_old.err
    stale = cli("verify", "--sink", SINK, "--epoch", "0", "--json").json()
    assert sum(d["different"] for d in stale["differences"]) == 3
    assert cli("resend", "--sink", SINK, "--from", "0", "--force").code == 0
    assert cli("verify", "--sink", SINK, "--epoch", "0").code == 0


def test_verify_with_the_v2_api_is_reported_unsupported(tp: TwoPhase, cli: Cli) -> None:
    known_store(tp)
    result = cli(
        "verify", "--sink", SINK, "--influx-api", "v2", "--influx-org", "o", "--influx-bucket", "b"
    )
    assert result.code == 2  # no answer: not 1, which says that a target differs
    assert "2.x API" in result.one_line_error()


def test_verify_exits_as_diff_does(tp: TwoPhase, cli: Cli) -> None:
    """0: InfluxDB holds the staged points; 1: it differs; 2: no answer (InfluxDB down)."""
    known_store(tp)
    same = cli.run("verify", "--sink", SINK)
    assert same.code == 0, same.out + same.err

    closed = cli.env() | {"TWOPHASE_TARGET_URL": f"http://127.0.0.1:{free_port()}"}
    down = cli.run("verify", "--sink", SINK, env=closed)
    assert (down.code, down.out) == (2, "")
    last = down.err.splitlines()[-1]  # after the progress lines of reading the store
    assert last.startswith("twophase: error: InfluxDB at") and "Traceback" not in down.err
    down_json = cli.run("verify", "--sink", SINK, "--json", env=closed)
    error = json.loads(down_json.err.splitlines()[-1])  # the error is one line of JSON
    assert down_json.code == error["exit_code"] == 2 and down_json.out == ""
    assert "cannot connect" in error["error"] and error["setting"] is None

    config = tp.config.target
    query_v1(config.url, config.influxdb.database, f'DROP MEASUREMENT "{M}"', method="POST")
    differs = cli.run("verify", "--sink", SINK)
    assert differs.code == 1, differs.err
    assert differs.out.splitlines()[-1].startswith("DIFFERENCES in 3 series")
