"""The ``twophase`` command line: commands, flags and argument types.

The connection flags are the settings marked ``flag`` in
:data:`twophase.config.SETTINGS`; each overrides its ``TWOPHASE_*`` variable.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from twophase import __version__
from twophase.cli import commands as cmd
from twophase.cli.console import Console
from twophase.config import BY_NAME, CLI_FLAGS, parse_duration
from twophase.errors import ConfigError
from twophase.operations import LIVE_WINDOW_S
from twophase.operations.exporter import DEFAULT_PORT
from twophase.wording import age

Handler = Callable[[Console], int]


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (no usage dump) and exit 2."""

    def error(self, message: str) -> Any:
        self.exit(cmd.EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


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


def _common(suppress: bool) -> Parser:
    """Connection and output flags, accepted before or after the command."""
    parent = Parser(add_help=False)

    def default(value: Any) -> Any:
        # In a command's copy an absent flag must not overwrite one given before the command.
        return argparse.SUPPRESS if suppress else value

    group = parent.add_argument_group("connection (override the TWOPHASE_* variables)")
    for name in CLI_FLAGS:
        setting = BY_NAME[name]
        metavar = name.rsplit("_", 1)[-1].upper()
        group.add_argument(
            setting.cli_flag, metavar=metavar, help=setting.help, default=default(None)
        )
    parent.add_argument(
        "--json",
        action="store_true",
        default=default(False),
        help="print JSON (sorted keys, ISO-8601 UTC times)",
    )
    parent.add_argument(
        "--debug", action="store_true", default=default(False), help="debug logging and tracebacks"
    )
    return parent


def _sink(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument("--sink", required=required, metavar="S", help="the sink id")


def _epochs(parser: argparse.ArgumentParser, single_only: bool = False) -> None:
    parser.add_argument("--epoch", type=_epoch, metavar="N", required=single_only)
    if not single_only:
        parser.add_argument("--from", dest="first", type=_epoch, metavar="A")
        parser.add_argument("--to", dest="last_epoch", type=_epoch, metavar="B")


def _live_window(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--live-window",
        type=_duration("--live-window"),
        default=LIVE_WINDOW_S,
        metavar="DURATION",
        help=f"an owner active this recently is live (default {age(LIVE_WINDOW_S)})",
    )


def _guard(parser: argparse.ArgumentParser, confirm: bool = True) -> None:
    parser.add_argument(
        "--force", action="store_true", help="act even while a live run owns the sink (fencing it)"
    )
    _live_window(parser)
    if confirm:
        parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")


def _inspection(command: Callable[[str, Handler, str], Any]) -> None:
    sub = command("status", cmd.cmd_status, "per sink: owner, epochs, staged points, dead letters")
    _sink(sub, required=False)
    _live_window(sub)
    sub = command("epochs", cmd.cmd_epochs, "one line per epoch (the last 20 by default)")
    _sink(sub)
    _epochs(sub)
    sub.add_argument("--last", type=_count, metavar="N", help="the last N epochs (default 20)")
    sub = command("verify", cmd.cmd_verify, "compare the staged points with InfluxDB")
    _sink(sub)
    _epochs(sub)
    sub = command(
        "dead-letters", cmd.cmd_dead_letters, "list, export or requeue rejected rows and points"
    )
    _sink(sub)
    _epochs(sub, single_only=False)
    sub.add_argument("--export", metavar="FILE", help="write all to FILE (.csv or .jsonl)")
    sub.add_argument("--limit", type=_count, default=100, metavar="N", help="0 lists all")
    sub.add_argument(
        "--requeue",
        action="store_true",
        help="deliver the points InfluxDB refused again, once, as a correction of the sink",
    )
    sub.add_argument("--reason", metavar="TEXT", help="with --requeue: only reasons holding TEXT")
    sub.add_argument("--dry-run", action="store_true", help="with --requeue: count, send nothing")
    _guard(sub, confirm=False)
    sub = command("db", cmd.cmd_db, "the staging schema: upgrade it, or show its revision")
    sub.add_argument("action", choices=["upgrade", "current"])
    sub.add_argument("--revision", default="head", metavar="REV", help="upgrade to (head)")
    sub = command("metrics", cmd.cmd_metrics, "serve every sink's metrics to Prometheus")
    sub.add_argument("action", choices=["serve"], help="serve: run the exporter until stopped")
    sub.add_argument("--port", type=_count, default=DEFAULT_PORT, metavar="N")
    sub.add_argument("--host", default="0.0.0.0", help="address to listen on (default all)")
    _live_window(sub)


def _actions(command: Callable[[str, Handler, str], Any]) -> None:
    sub = command("recover", cmd.cmd_recover, "promote every PRECOMMITTED epoch, in order")
    _sink(sub, required=False)
    _guard(sub, confirm=False)
    sub = command(
        "resend", cmd.cmd_resend, "send the retained points of COMMITTED epochs again (operator)"
    )
    _sink(sub)
    _epochs(sub)
    sub.add_argument("--all", action="store_true", help="every retained COMMITTED epoch")
    _guard(sub, confirm=False)
    sub = command("abort", cmd.cmd_abort, "discard a PRECOMMITTED epoch (operator decision)")
    _sink(sub)
    _epochs(sub, single_only=True)
    sub.add_argument("--reason", default="aborted by an operator", metavar="TEXT")
    _guard(sub)
    sub = command("gc", cmd.cmd_gc, "remove staged points past retention and orphaned writes")
    _sink(sub, required=False)
    sub.add_argument("--retention", type=_duration("--retention"), metavar="DURATION")
    sub.add_argument("--orphan-grace", type=_duration("--orphan-grace"), metavar="DURATION")
    sub.add_argument("--dry-run", action="store_true", help="count, remove nothing")
    sub.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    sub = command("reset", cmd.cmd_reset, "unbind a sink from its query after a checkpoint reset")
    _sink(sub)
    _guard(sub)


def build_parser() -> Parser:
    parser = Parser(
        prog="twophase",
        parents=[_common(False)],
        description="Operate a twophase staging store (Spark -> PostgreSQL -> "
        "InfluxDB, exactly once).",
    )
    parser.add_argument("--version", action="version", version=f"twophase {__version__}")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=Parser
    )
    common = _common(True)

    def command(name: str, handler: Handler, text: str) -> Any:
        sub = commands.add_parser(name, parents=[common], help=text, description=text)
        sub.set_defaults(handler=handler)
        return sub

    _inspection(command)
    _actions(command)
    return parser
