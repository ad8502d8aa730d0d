"""The CLI's conventions without servers: help on every flag, the connection flags each
command shows, JSON errors with --json, verify's exit status, and the offline schema SQL."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from typing import Any

import pytest

from twophase.cli import build_parser, main
from twophase.config import SETTINGS, STAGING, TARGET_SECTIONS
from twophase.store.database import SCHEMA_REVISION

STAGING_FLAGS = {s.cli_flag for s in SETTINGS if s.flag and s.section == STAGING}
TARGET_FLAGS = {s.cli_flag for s in SETTINGS if s.flag and s.section in TARGET_SECTIONS}
BOTH = STAGING_FLAGS | TARGET_FLAGS
# The connection flags each command takes after its name: those of the servers it talks to.
SECTIONS = {
    "status": STAGING_FLAGS,
    "epochs": STAGING_FLAGS,
    "verify": BOTH,
    "dead-letters": BOTH,  # --requeue sends to InfluxDB
    "db upgrade": STAGING_FLAGS,
    "db downgrade": STAGING_FLAGS,
    "db current": STAGING_FLAGS,
    "db history": STAGING_FLAGS,
    "db grants": STAGING_FLAGS,  # --apply connects
    "metrics": STAGING_FLAGS,
    "recover": BOTH,
    "resend": BOTH,
    "targets": BOTH,  # resync sends to InfluxDB
    "abort": STAGING_FLAGS,
    "gc": STAGING_FLAGS,
    "reset": STAGING_FLAGS,
}


def parsers(parser: argparse.ArgumentParser, name: str = "") -> Iterator[tuple[str, Any]]:
    """Every parser under ``parser`` by its command (``""`` for ``twophase`` itself)."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command, sub in action.choices.items():
                yield from parsers(sub, f"{name} {command}".strip())


PARSERS = dict(parsers(build_parser()))


@pytest.fixture(autouse=True)
def no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI reads TWOPHASE_* variables: the test's arguments alone must decide."""
    import os

    for key in [k for k in os.environ if k.startswith("TWOPHASE_")]:
        monkeypatch.delenv(key)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's own usage errors
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("command", sorted(PARSERS), ids=lambda c: c or "twophase")
def test_every_flag_and_argument_has_help(command: str) -> None:
    actions = [a for a in PARSERS[command]._actions if not isinstance(a, argparse._HelpAction)]
    silent = [a.dest for a in actions if not a.help or a.help == argparse.SUPPRESS]
    assert silent == []


def test_the_sections_cover_every_command() -> None:
    leaves = {name for name, parser in PARSERS.items() if parser.get_default("handler")}
    assert leaves == set(SECTIONS)


@pytest.mark.parametrize("command", sorted(SECTIONS))
def test_a_command_shows_the_connection_flags_it_uses(command: str) -> None:
    flags = {f for a in PARSERS[command]._actions for f in a.option_strings} & BOTH
    assert flags == SECTIONS[command]


def test_the_help_of_db_upgrade_and_verify() -> None:
    upgrade, verify = PARSERS["db upgrade"].format_help(), PARSERS["verify"].format_help()
    assert "--staging-url" in upgrade and "--target-url" not in upgrade
    assert "--staging-url" in verify and "--target-url" in verify
    assert "1 a target differs" in " ".join(verify.split())  # the exit status, in the epilog


def test_db_help_names_exactly_the_actions_it_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """The actions ``twophase db --help`` names are those that parse to a handler (a help
    once named a ``show`` that did not exist)."""
    runnable = {c.split()[1] for c in SECTIONS if c.startswith("db ")}
    assert runnable == {"upgrade", "downgrade", "current", "history", "grants"}
    code, out, _ = run(capsys, "db", "--help")
    text = " ".join(out.split())
    assert code == 0 and "its actions: " in text, text
    named = text.split("its actions: ", 1)[1].split(" positional")[0]
    assert set(named.split(", ")) == runnable
    assert run(capsys, "db", "show")[0] == 2


def test_every_connection_flag_is_accepted_before_any_command() -> None:
    args = build_parser().parse_args(["--target-url", "http://i:8086", "db", "current"])
    assert args.target_url == "http://i:8086"
    refused = PARSERS["db current"].parse_known_args(["--target-url", "http://i:8086"])
    assert refused[1] == ["--target-url", "http://i:8086"]  # not one of its flags after it


def test_a_usage_error_with_json_is_one_json_object(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--json", "epochs", "--sink", "s", "--last", "x")
    assert (code, out) == (2, "")
    assert json.loads(err) == {
        "error": "argument --last: 'x' is not a count (an integer >= 0) "
        "(see twophase epochs --help)",
        "setting": None,
        "exit_code": 2,
    }
    code, _, err = run(capsys, "frobnicate", "--json")
    assert code == 2 and "invalid choice: 'frobnicate'" in json.loads(err)["error"]


def test_a_bad_flag_with_json_names_the_setting(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--json", "--staging-url", "mysql://u@h/db", "status")
    assert (code, out) == (2, "")
    error = json.loads(err)
    assert error["setting"] == "staging_url" and error["exit_code"] == 2
    assert error["error"].startswith("--staging-url: must be a PostgreSQL URL")


def test_a_missing_variable_with_json_names_the_setting(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run(capsys, "status", "--json")
    assert code == 1
    assert json.loads(err) == {
        "error": "TWOPHASE_STAGING_URL: is required but not set",
        "setting": "staging_url",
        "exit_code": 1,
    }
    monkeypatch.setenv("TWOPHASE_STAGING_URL_FILE", "/nonexistent/url")
    code, _, err = run(capsys, "status", "--json")
    assert code == 1 and json.loads(err)["setting"] == "staging_url"  # the file's variable


def test_errors_without_json_stay_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "status")
    assert (code, err) == (1, "twophase: error: TWOPHASE_STAGING_URL: is required but not set\n")


def test_verify_without_an_answer_exits_2_where_other_commands_exit_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run(capsys, "verify", "--sink", "s", "--json")
    assert code == 2 and json.loads(err)["exit_code"] == 2  # 1 would read as "it differs"
    assert run(capsys, "recover")[0] == 1


def test_db_upgrade_sql_needs_no_database(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "db", "upgrade", "--sql")
    assert (code, err) == (0, "")
    assert out.startswith("BEGIN;") and out.rstrip().endswith("COMMIT;")
    assert "CREATE TABLE twophase_sinks" in out and "CREATE TABLE twophase_alembic_version" in out
    code, out, _ = run(capsys, "db", "downgrade", "0004_sink_counters", "--sql", "--json")
    script = json.loads(out)
    assert code == 0 and (script["start"], script["target"]) == (
        SCHEMA_REVISION,
        "0004_sink_counters",
    )
    assert "ALTER TABLE twophase_staged_chunks DROP COLUMN lane" in script["sql"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["db", "downgrade", "0004:0005", "--sql"], "cannot downgrade from 0004_sink_counters"),
        (["db", "upgrade", "--revision", "0005:0004", "--sql"], "cannot upgrade from 0005"),
        (["db", "upgrade", "--revision", "nosuch", "--sql"], "'nosuch'"),
        (["db", "downgrade", "0005:0004"], "FROM:TO goes with --sql"),
    ],
)
def test_a_revision_that_cannot_work_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, "")
    assert message in err and len(err.splitlines()) == 1


def test_targets_lists_by_default_and_resyncs_a_named_target() -> None:
    listing = build_parser().parse_args(["targets", "--sink", "s", "--json"])
    assert (listing.action, listing.name, listing.sink, listing.json) == (None, None, "s", True)
    resync = build_parser().parse_args(
        ["targets", "resync", "b", "--sink", "s", "--from-epoch", "3", "--yes", "--force"]
    )
    assert (resync.action, resync.name, resync.sink) == ("resync", "b", "s")
    assert (resync.from_epoch, resync.yes, resync.force) == (3, True, True)
    for command in ("verify", "resend"):
        args = build_parser().parse_args([command, "--sink", "s", "--target", "b"])
        assert args.target == "b"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["targets", "frob"], "invalid choice: 'frob'"),
        (["targets", "resync", "b", "--from-epoch", "-1"], "'-1' is not a count"),
        (["targets", "--from-epoch", "3"], "go with `targets resync`"),
        (["targets", "--yes"], "go with `targets resync`"),
        (["targets", "resync", "--sink", "s"], "resync NAME --sink S"),
        (["targets", "resync", "b"], "resync NAME --sink S"),
    ],
)
def test_targets_usage_errors_need_no_server(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, "")
    assert message in err and len(err.splitlines()) == 1


SERVERS = ["--staging-url", "postgresql://u@127.0.0.1:1/db"]
TWO = ["--targets", "a=http://127.0.0.1:1,b=http://127.0.0.1:2"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["targets", "resync", "b", "--sink", "s", "--target-url", "http://127.0.0.1:1"],
            "unknown target 'b': this configuration names one target server",
        ),
        (
            [*TWO, "targets", "resync", "c", "--sink", "s"],
            "unknown target 'c': the configuration (TWOPHASE_TARGETS) names a, b",
        ),
        ([*TWO, "verify", "--sink", "s", "--target", "c"], "unknown target 'c'"),
        ([*TWO, "resend", "--sink", "s", "--all", "--target", "c"], "unknown target 'c'"),
        (
            ["--target-url", "http://127.0.0.1:1", "verify", "--sink", "s", "--target", "b"],
            "names one target server (TWOPHASE_TARGET_URL, target 'default')",
        ),
    ],
)
def test_a_target_the_configuration_does_not_name_is_refused_before_connecting(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    """Nothing listens on the servers' ports: the refusal comes first, exit 2."""
    code, out, err = run(capsys, *SERVERS, *argv, "--json")
    assert (code, out) == (2, "")
    error = json.loads(err)
    assert message in error["error"] and error["exit_code"] == 2
