"""The ``twophase`` command line: commands, flags and argument types.

The connection flags are the settings marked ``flag`` in
[`twophase.config.SETTINGS`][twophase.config.settings.SETTINGS]; each overrides its
``TWOPHASE_*`` variable. All of them are accepted before the command; after it, a command
takes the flags of the servers it talks to: the staging store's, and the targets' for those
that send to or read from the targets.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from twophase import __version__, logs
from twophase.cli import commands as cmd
from twophase.cli.console import Console, error_json, printable
from twophase.config import (
    BY_NAME,
    CLI_ALIASES,
    CLI_FLAGS,
    STAGING,
    TARGET_SECTIONS,
    parse_duration,
)
from twophase.errors import ConfigError
from twophase.operations import LIVE_WINDOW_S
from twophase.operations.exporter import DEFAULT_PORT
from twophase.wording import age

Handler = Callable[[Console], int]

VERIFY_EXIT_STATUS = (
    "exit status, as diff's: 0 the targets hold exactly the staged points; 1 a target differs "
    "(the differences are listed); 2 no answer: wrong usage, a setting missing or wrong, "
    "a server unreachable"
)


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (no usage dump) and exit 2; with
    ``json_errors`` (``--json`` was given) the JSON object every error is then."""

    def __init__(self, *args: Any, json_errors: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.json_errors = json_errors

    def error(self, message: str) -> Any:
        text = f"{message} (see {self.prog} --help)"
        if self.json_errors:
            self.exit(cmd.EXIT_USAGE, error_json(text, None, cmd.EXIT_USAGE))
        self.exit(cmd.EXIT_USAGE, f"{self.prog}: error: {printable(text)}\n")


def _epoch(text: str) -> int:
    """A Spark epoch (``17``) or a correction (``c3``: epoch -3)."""
    number, sign = (text[1:], -1) if text[:1].lower() == "c" else (text, 1)
    if not number.isdigit() or (sign < 0 and int(number) == 0):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an epoch (an integer >= 0, or cN for the N-th correction)"
        )
    return sign * int(number)


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a count (an integer >= 0)")
    return int(text)


def _duration(option: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            return parse_duration(text, option)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(exc.problem) from None

    return parse


def _log_format(text: str) -> str:
    # Checked while parsing: JSON without python-json-logger is a usage error, not a traceback.
    try:
        logs.formatter(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(exc.problem) from None
    return text


def _common(suppress: bool, sections: tuple[str, ...]) -> Parser:
    """The connection flags of ``sections`` and the output flags, accepted before or
    after the command."""
    parent = Parser(add_help=False)

    def default(value: Any) -> Any:
        # In a command's copy an absent flag must not overwrite one given before the command.
        return argparse.SUPPRESS if suppress else value

    group = parent.add_argument_group("connection (override the TWOPHASE_* variables)")
    for name in (*CLI_FLAGS, *CLI_ALIASES):
        setting = BY_NAME[name]
        if setting.section in sections:
            # A former name (--influx-url) is a flag of its own, so that giving both is
            # caught like any two names of one setting.
            shown = setting.help if name == setting.name else f"former name of {setting.cli_flag}"
            group.add_argument(
                "--" + name.replace("_", "-"),
                metavar=setting.name.rsplit("_", 1)[-1].upper(),
                help=shown,
                default=default(None),
            )
    parent.add_argument(
        "--json",
        action="store_true",
        default=default(False),
        help="print JSON (sorted keys, ISO-8601 UTC times); errors too, on stderr",
    )
    parent.add_argument(
        "--debug", action="store_true", default=default(False), help="debug logging and tracebacks"
    )
    parent.add_argument(
        "--log-format",
        type=_log_format,
        choices=logs.FORMATS,
        default=default(logs.TEXT),
        help="log lines on stderr as text or JSON objects (json: pip install twophase[json-logs])",
    )
    return parent


class _Commands:
    """Adds commands to a subparsers action; each gets the connection flags of the servers
    it talks to."""

    def __init__(self, subparsers: Any, json_errors: bool) -> None:
        self._subparsers, self._json_errors = subparsers, json_errors
        self._staging = _common(True, (STAGING,))
        self._both = _common(True, (STAGING, *TARGET_SECTIONS))

    def add(
        self,
        name: str,
        handler: Handler,
        text: str,
        influx: bool = False,
        failed: int = cmd.EXIT_FAILED,
        epilog: str | None = None,
    ) -> Parser:
        """A command; ``influx``: it talks to the targets too (the settings of section
        ``influx``); ``failed``: its exit code when it fails."""
        parent = self._both if influx else self._staging
        sub = self._parser(name, text, parents=[parent], epilog=epilog)
        sub.set_defaults(handler=handler, failed=failed)
        return sub

    def group(self, name: str, text: str, build: Callable[[_Commands], None]) -> Parser:
        """A command of commands (``db upgrade``), its actions added by ``build``; the
        flags go to each of them. Its description names the actions ``build`` added, the
        ones it dispatches to, so that its help cannot name one it does not have."""
        sub = self._parser(name, text)
        actions = sub.add_subparsers(
            dest="action", required=True, metavar="ACTION", parser_class=Parser, help="the action"
        )
        build(_Commands(actions, self._json_errors))
        sub.description = f"{text}; its actions: {', '.join(actions.choices)}"
        return sub

    def _parser(self, name: str, text: str, **more: Any) -> Parser:
        sub: Parser = self._subparsers.add_parser(
            name, help=text, description=text, json_errors=self._json_errors, **more
        )
        return sub


def _sink(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument("--sink", required=required, metavar="S", help="the sink id")


def _epochs(parser: argparse.ArgumentParser, single_only: bool = False) -> None:
    parser.add_argument(
        "--epoch",
        type=_epoch,
        metavar="N",
        required=single_only,
        help="one epoch: N, or cN for the N-th correction",
    )
    if not single_only:
        parser.add_argument(
            "--from", dest="first", type=_epoch, metavar="A", help="the first epoch of a range"
        )
        parser.add_argument(
            "--to", dest="last_epoch", type=_epoch, metavar="B", help="the last epoch of a range"
        )


def _live_window(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--live-window",
        type=_duration("--live-window"),
        default=LIVE_WINDOW_S,
        metavar="DURATION",
        help=f"an owner active this recently is live (default {age(LIVE_WINDOW_S)})",
    )


def _guard(
    parser: argparse.ArgumentParser,
    confirm: bool = True,
    force: str = "act even while a live run owns the sink (fencing it)",
) -> None:
    parser.add_argument("--force", action="store_true", help=force)
    _live_window(parser)
    if confirm:
        _yes(parser)


def _target(parser: argparse.ArgumentParser, text: str) -> None:
    parser.add_argument(
        "--target",
        metavar="NAME",
        help=f"a target the configuration names (TWOPHASE_TARGETS): {text}",
    )


def _yes(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")


def _setting_default(option: str) -> str:
    setting = BY_NAME[option]
    return f"default: {setting.env}, else {age(setting.default)}"


def _inspection(commands: _Commands) -> None:
    sub = commands.add(
        "status", cmd.cmd_status, "per sink: owner, epochs, staged points, dead letters"
    )
    _sink(sub, required=False)
    _live_window(sub)
    sub = commands.add("epochs", cmd.cmd_epochs, "one line per epoch (the last 20 by default)")
    _sink(sub)
    _epochs(sub)
    sub.add_argument("--last", type=_count, metavar="N", help="the last N epochs (default 20)")
    sub = commands.add(
        "verify",
        cmd.cmd_verify,
        "compare the staged points with what the targets hold",
        influx=True,
        failed=cmd.EXIT_NO_ANSWER,
        epilog=VERIFY_EXIT_STATUS,
    )
    _sink(sub)
    _epochs(sub)
    _target(sub, "verify that target only (default: every target, in turn)")
    _dead_letters(commands)
    commands.group("db", "the staging schema and the roles' GRANTs", _schema)
    sub = commands.add("metrics", cmd.cmd_metrics, "serve every sink's metrics to Prometheus")
    sub.add_argument("action", choices=["serve"], help="serve: run the exporter until stopped")
    port, host = BY_NAME["exporter_port"], BY_NAME["exporter_host"]
    sub.add_argument(
        "--port",
        type=_count,
        metavar="N",
        help=f"port to listen on, 0: any free (default: {port.env}, else {DEFAULT_PORT})",
    )
    sub.add_argument(
        "--host",
        metavar="ADDRESS",
        help=(
            f"address to listen on (default: {host.env}, else {host.default}: this host only;"
            " 0.0.0.0: every interface). TLS: TWOPHASE_EXPORTER_TLS_CERT, _KEY, _CLIENT_CA"
        ),
    )
    _live_window(sub)


def _dead_letters(commands: _Commands) -> None:
    sub = commands.add(
        "dead-letters",
        cmd.cmd_dead_letters,
        "list, export or requeue rejected rows and points",
        influx=True,  # --requeue sends
    )
    _sink(sub)
    _epochs(sub, single_only=False)
    sub.add_argument(
        "--export",
        metavar="FILE",
        help=(
            "write all to FILE (.csv or .jsonl), whole or not at all, readable by its owner "
            "alone (mode 0600); a CSV text cell that would start a spreadsheet formula "
            "(=, +, -, @, tab, carriage return) starts with '"
        ),
    )
    sub.add_argument("--limit", type=_count, default=100, metavar="N", help="0 lists all")
    sub.add_argument(
        "--requeue",
        action="store_true",
        help="deliver the points the targets refused again, once, as a correction of the sink",
    )
    sub.add_argument("--reason", metavar="TEXT", help="with --requeue: only reasons holding TEXT")
    sub.add_argument(
        "--target",
        metavar="NAME",
        help="with --requeue and several targets: the letters target NAME refused (a "
        "correction goes to that target only)",
    )
    sub.add_argument("--dry-run", action="store_true", help="with --requeue: count, send nothing")
    _guard(sub, confirm=False)


def _schema(actions: _Commands) -> None:
    sql = "print the SQL for a DBA instead of running it (the database is not touched)"
    sub = actions.add("upgrade", cmd.cmd_db_upgrade, "create or upgrade the staging schema")
    sub.add_argument(
        "--revision",
        default="head",
        metavar="REV",
        help="upgrade to REV (default head); with --sql also FROM:TO (FROM default: no schema)",
    )
    sub.add_argument("--sql", action="store_true", help=sql)
    sub = actions.add(
        "downgrade", cmd.cmd_db_downgrade, "downgrade the staging schema (drops data)"
    )
    sub.add_argument(
        "revision",
        metavar="REV",
        help="the revision to go down to (base: no schema); with --sql also FROM:TO "
        "(FROM default: the head)",
    )
    sub.add_argument("--sql", action="store_true", help=sql)
    _yes(sub)
    actions.add("current", cmd.cmd_db_current, "the store's revision, and whether it is the head")
    actions.add(
        "history", cmd.cmd_db_history, "the shipped revisions, the head and the current one"
    )
    _grants(actions)


# The kinds of process that may each run as a role of least privilege, and what they do.
_ROLE_KINDS = (
    ("executor", "the Spark executors' role: they stage"),
    ("driver", "the driver's role: the protocol (claim, decide, promote, mark, GC), staging too"),
    (
        "operator",
        "the role of the commands that change the store: recover, resend, dead-letters "
        "--requeue, targets resync and remove, abort, gc, reset",
    ),
    ("reader", "the read-only role: the exporter, verify, status, epochs, dead-letters, targets"),
)


def _grants(actions: _Commands) -> None:
    sub = actions.add(
        "grants",
        cmd.cmd_db_grants,
        "print the GRANTs that give existing roles what each kind of process needs in the "
        "staging store, or run them as the schema's owner (--apply)",
    )
    for kind, text in _ROLE_KINDS:
        sub.add_argument(f"--{kind}", metavar="ROLE", help=text)
    sub.add_argument(
        "--schema",
        metavar="NAME",
        help="the schema of the staging tables, for the printed SQL (default public; "
        "--apply finds it)",
    )
    sub.add_argument(
        "--apply",
        action="store_true",
        help="run the GRANTs in the store, connected as its owner (the role of the staging URL)",
    )


def _actions(commands: _Commands) -> None:
    sub = commands.add(
        "recover", cmd.cmd_recover, "promote every PRECOMMITTED epoch, in order", influx=True
    )
    _sink(sub, required=False)
    _guard(sub, confirm=False)
    sub = commands.add(
        "resend",
        cmd.cmd_resend,
        "send the retained points of COMMITTED epochs again (operator)",
        influx=True,
    )
    _sink(sub)
    _epochs(sub)
    sub.add_argument("--all", action="store_true", help="every retained COMMITTED epoch")
    _target(sub, "send to that target only (default: to every target)")
    _guard(sub, confirm=False)
    _targets(commands)
    sub = commands.add("abort", cmd.cmd_abort, "discard a PRECOMMITTED epoch (operator decision)")
    _sink(sub)
    _epochs(sub, single_only=True)
    sub.add_argument(
        "--reason",
        default="aborted by an operator",
        metavar="TEXT",
        help="why, recorded in the epoch's history (default: aborted by an operator)",
    )
    _guard(sub)
    sub = commands.add("gc", cmd.cmd_gc, "remove staged points past retention and orphaned writes")
    _sink(sub, required=False)
    sub.add_argument(
        "--retention",
        type=_duration("--retention"),
        metavar="DURATION",
        help=f"keep the staged points of ended epochs this long ({_setting_default('retention')})",
    )
    sub.add_argument(
        "--orphan-grace",
        type=_duration("--orphan-grace"),
        metavar="DURATION",
        help="a write of a never-decided epoch is garbage at this age "
        f"({_setting_default('orphan_grace')})",
    )
    sub.add_argument("--dry-run", action="store_true", help="count, remove nothing")
    _yes(sub)
    sub = commands.add(
        "reset", cmd.cmd_reset, "unbind a sink from its query after a checkpoint reset"
    )
    _sink(sub)
    _guard(sub)


def _targets(commands: _Commands) -> None:
    sub = commands.add(
        "targets",
        cmd.cmd_targets,
        "per target of each sink: state, delivered epoch, lag; resync or remove one",
        influx=True,  # resync sends
    )
    sub.add_argument(
        "action",
        nargs="?",
        choices=["resync", "remove"],
        help="resync: re-deliver to target NAME, in epoch order, what staging still "
        "retains of the epochs it lacks; remove: decommission target NAME (its cursor, "
        "backlog, deliveries, dead letters and the corrections owed to it alone deleted: "
        "GC no longer waits for it) (default: list the targets)",
    )
    sub.add_argument("name", nargs="?", metavar="NAME", help="with resync or remove: the target")
    _sink(sub, required=False)
    sub.add_argument(
        "--from-epoch",
        type=_count,
        metavar="E",
        help="with resync: re-deliver from epoch E on (default: the first the target lacks)",
    )
    _guard(
        sub,
        force="act even while a live run owns the sink (resync fences it; remove does not); "
        "with remove, also a target the configuration still names",
    )


def build_parser(json_errors: bool = False) -> Parser:
    """The parser of every command; ``json_errors``: usage errors as JSON (``--json``)."""
    parser = Parser(
        prog="twophase",
        parents=[_common(False, (STAGING, *TARGET_SECTIONS))],
        description="Operate a twophase staging store (Spark -> PostgreSQL -> "
        "the targets, exactly once).",
        json_errors=json_errors,
        # This parser reads every flag of the line, a command's too: abbreviated, a
        # command's --target would be ambiguous between --target-url and --targets.
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"twophase {__version__}")
    subparsers = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="COMMAND",
        parser_class=Parser,
        help="the command (twophase COMMAND --help)",
    )
    commands = _Commands(subparsers, json_errors)
    _inspection(commands)
    _actions(commands)
    return parser
