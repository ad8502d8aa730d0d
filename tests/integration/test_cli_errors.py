"""Bad arguments and broken surroundings: one line on stderr, exit 2 or 1, no traceback."""

from __future__ import annotations

import json

import pytest

from tests.integration.cli_helpers import SINK, Cli, known_store, make_cli, make_idle
from tests.support import create_database, drop_database, unique
from twophase.config import TargetConfig
from twophase.protocol.commit.runtime import TwoPhase


@pytest.fixture
def cli(staging_url: str, influx: TargetConfig) -> Cli:
    return make_cli(staging_url, influx)


def staging_only_env(cli: Cli) -> dict[str, str]:
    return {
        k: v
        for k, v in cli.env().items()
        if not k.startswith(("TWOPHASE_INFLUX", "TWOPHASE_TARGET"))
    }


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        ([], 2, "the following arguments are required: COMMAND"),
        (["frobnicate"], 2, "invalid choice: 'frobnicate'"),
        (["epochs"], 2, "the following arguments are required: --sink"),
        (["epochs", "--sink", "s", "--last", "x"], 2, "argument --last: 'x' is not a count"),
        (["gc", "--retention", "7x"], 2, "argument --retention: '7x' is not a duration"),
        (["gc", "--orphan-grace", "-1h"], 2, "argument --orphan-grace"),
        (["status", "--live-window", "soon"], 2, "argument --live-window"),
        (["--staging-url", "mysql://u@h/db", "status"], 2, "--staging-url: must be a PostgreSQL"),
        (["--influx-api", "v9", "recover"], 2, "--influx-api: 'v9' is not one of v1, v2, v3, auto"),
        (["status", "--sink", "ghost"], 2, "unknown sink 'ghost' (the store has no sinks)"),
        (["resend", "--sink", "ghost", "--all"], 2, "unknown sink 'ghost'"),
        (["dead-letters", "--sink", "ghost"], 2, "unknown sink 'ghost'"),
        (["gc", "--sink", "ghost", "--dry-run"], 2, "unknown sink 'ghost'"),
    ],
)
def test_bad_arguments(cli: Cli, args: list[str], code: int, message: str) -> None:
    result = cli(*args)
    assert result.code == code, result.err
    assert message in result.one_line_error()
    assert result.out == ""


def test_staging_only_commands_need_no_influxdb_settings(tp: TwoPhase, cli: Cli) -> None:
    known_store(tp)
    make_idle(cli.staging_url)
    env = staging_only_env(cli)
    for args in (
        ["status"],
        ["epochs", "--sink", SINK],
        ["dead-letters", "--sink", SINK],
        ["gc", "--dry-run"],
        ["abort", "--sink", SINK, "--epoch", "3", "--yes"],
        ["reset", "--sink", "t", "--yes", "--force"],
    ):
        result = cli.run(*args, env=env)
        assert result.code == 0, (args, result.err)
    missing = cli.run("recover", env=env)
    assert missing.code == 1
    assert "TWOPHASE_TARGET_URL: is required but not set" in missing.one_line_error()


def test_unreachable_staging_store(cli: Cli) -> None:
    env = cli.env() | {
        "TWOPHASE_STAGING_URL": "postgresql+psycopg://u:secret-pw@127.0.0.1:1/none",
        "TWOPHASE_STAGING_CONNECT_TIMEOUT": "2s",
    }
    result = cli.run("status", env=env)
    assert result.code == 1
    line = result.one_line_error()
    assert "staging database" in line and "secret-pw" not in result.err


def test_store_without_schema(cli: Cli, staging_url: str) -> None:
    name = unique("twophase_empty")
    url = create_database(staging_url, name)
    try:
        result = cli.run("status", env=cli.env() | {"TWOPHASE_STAGING_URL": url})
        assert result.code == 1
        assert "run `twophase db upgrade`" in result.one_line_error()
    finally:
        drop_database(staging_url, name)


def test_influxdb_down_during_recover(tp: TwoPhase, cli: Cli) -> None:
    known_store(tp)
    make_idle(cli.staging_url)
    env = cli.env() | {
        "TWOPHASE_TARGET_URL": "http://127.0.0.1:1",
        "TWOPHASE_TARGET_RETRY_DEADLINE": "1s",
        "TWOPHASE_TARGET_RETRY_INITIAL": "100ms",
    }
    result = cli.run("recover", env=env)
    assert result.code == 1
    assert "InfluxDB" in result.err.splitlines()[-1] and "Traceback" not in result.err
    status = cli("status", "--sink", SINK, "--json").json()["sinks"][0]
    assert status["precommitted_epochs"] == 1 and "TargetUnavailableError" in status["last_error"]


def test_debug_shows_the_traceback(cli: Cli) -> None:
    result = cli("--debug", "status", "--sink", "ghost")
    assert result.code == 2
    assert "Traceback" in result.err and "UnknownSinkError" in result.err


def test_password_in_a_flag_is_warned_about_once_and_never_printed(cli: Cli) -> None:
    result = cli("status")  # the dev URL has a password
    assert result.code == 0
    (warning,) = [line for line in result.err.splitlines() if "--staging-url" in line]
    assert "the password in --staging-url is visible to other users" in warning
    for where in ("as TWOPHASE_STAGING_URL,", "TWOPHASE_STAGING_URL_FILE", "TWOPHASE_CONFIG"):
        assert where in warning
    assert ":twophase@" not in result.err + result.out
    after = cli.run("status", "--staging-url", cli.staging_url)  # after the command too
    assert after.code == 0 and after.err.count("visible to other users") == 1
    assert ":twophase@" not in after.err + after.out
    url_alone = cli.staging_url.replace(":twophase@", "@")  # no password: no warning
    plain = cli.run(
        "status", "--staging-url", url_alone, env=cli.env() | {"PGPASSWORD": "twophase"}
    )
    assert plain.code == 0 and "visible to other users" not in plain.err


def test_with_json_every_error_is_one_json_line_on_stderr(tp: TwoPhase, cli: Cli) -> None:
    known_store(tp)
    bad_url = cli.run("--json", "--staging-url", "mysql://u@h/db", "status")
    assert (bad_url.code, bad_url.out) == (2, "")
    assert json.loads(bad_url.err) == {
        "error": "--staging-url: must be a PostgreSQL URL, not 'mysql'",
        "setting": "staging_url",
        "exit_code": 2,
    }
    usage = cli.run("epochs", "--json")  # argparse's own error
    assert usage.code == 2
    assert json.loads(usage.err) == {
        "error": "the following arguments are required: --sink (see twophase epochs --help)",
        "setting": None,
        "exit_code": 2,
    }
    ghost = cli.run("epochs", "--sink", "ghost", "--json")
    assert ghost.code == 2 and "unknown sink 'ghost'" in json.loads(ghost.err)["error"]
    missing = cli.run("recover", "--json", env=staging_only_env(cli))
    assert (missing.code, json.loads(missing.err)["setting"]) == (1, "target_url")
    plain = cli.run("epochs", "--sink", "ghost")  # without --json: the line as ever
    assert plain.err.startswith("twophase: error: unknown sink 'ghost'")


def test_a_json_error_masks_the_password(cli: Cli) -> None:
    env = cli.env() | {
        "TWOPHASE_STAGING_URL": "postgresql+psycopg://u:secret-pw@127.0.0.1:1/none",
        "TWOPHASE_STAGING_CONNECT_TIMEOUT": "2s",
    }
    result = cli.run("status", "--json", env=env)
    error = json.loads(result.err)
    assert result.code == error["exit_code"] == 1 and error["setting"] is None
    assert "staging database" in error["error"] and "u:***@" in error["error"]
    assert "secret-pw" not in result.err
