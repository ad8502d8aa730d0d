"""``twophase``: the operator's command line for a twophase staging store.

Commands: status, epochs, recover, replay, verify, abort, dead-letters, gc,
reset (``twophase COMMAND --help`` for each). Settings come from the
``TWOPHASE_*`` variables (see :mod:`twophase.config`); the connection flags
override them. Secrets (InfluxDB password or token, a database password) come
only from the environment or ``*_FILE`` files, never from a flag.

Exit codes: 0 success; 1 a failure the one-line message on stderr explains
(also: ``verify`` found differences, a refusal while a live run owns the
sink, a declined confirmation); 2 wrong usage (bad flags, unknown sink, an
epoch that is not recorded, a malformed duration, a destructive command
without ``--yes`` when stdin is not a terminal). Tracebacks only with --debug.

``--json`` prints one JSON object on stdout (sorted keys, indented; times as
ISO-8601 UTC ``...Z`` strings, durations in seconds). Top-level keys:
status ``sinks`` (objects with the fields of :class:`twophase.inspect.SinkStatus`);
epochs ``sink_id``, ``epochs`` (fields of ``EpochInfo``), ``events`` (with one
``--epoch``); recover ``recovered`` (``sink_id``, ``epoch``, ``delivered``,
``rejected``); replay ``sink_id``, ``replayed`` (``epoch``, ``points_sent``,
``points_rejected``), ``skipped_aborted``, ``skipped_purged``; verify ``sink_id``,
``epochs``, ``points``, ``series``, ``unparseable``, ``ok``, ``differences``
(fields of :class:`twophase.verify.SeriesDiff`), ``notes``; abort and reset
``sink_id`` and what was done; dead-letters ``total`` and ``dead_letters``
(fields of ``DeadLetterRow``) or ``exported`` and ``file``; gc ``dry_run``,
``retention_s``, ``orphan_grace_s``, ``sinks`` and the totals.

Layout: this module parses arguments and maps errors to exit codes;
:mod:`twophase.cli_support` holds output, confirmation and the live-run guard,
:mod:`twophase.cli_store` the commands on the staging store alone, and
:mod:`twophase.cli_delivery` those that talk to InfluxDB.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TextIO

from sqlalchemy.engine import make_url

from twophase.cli_delivery import cmd_recover, cmd_replay, cmd_verify
from twophase.cli_store import (
    cmd_abort,
    cmd_dead_letters,
    cmd_epochs,
    cmd_gc,
    cmd_reset,
    cmd_status,
)
from twophase.cli_support import (
    CONNECTION_FLAGS,
    EXIT_FAILED,
    EXIT_USAGE,
    LIVE_WINDOW_DEFAULT,
    Console,
    UsageError,
)
from twophase.config import parse_duration
from twophase.errors import ConfigError, TwoPhaseError
from twophase.inspect import EpochRangeError, UnknownSinkError


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (no usage dump) and exit 2."""

    def error(self, message: str) -> Any:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _epoch(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not an epoch number (an integer >= 0)")
    return value


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
    for name, meta, what in (
        ("staging-url", "URL", "staging database (password better in the environment)"),
        ("influx-url", "URL", "InfluxDB base URL"),
        ("influx-api", "API", "v1, v2 or auto"),
        ("influx-db", "DB", "1.x database"),
        ("influx-rp", "RP", "1.x retention policy"),
        ("influx-org", "ORG", "2.x organisation"),
        ("influx-bucket", "BUCKET", "2.x bucket"),
    ):
        group.add_argument(f"--{name}", metavar=meta, help=what, default=default(None))
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


def _guard(parser: argparse.ArgumentParser, confirm: bool = True) -> None:
    parser.add_argument(
        "--force", action="store_true", help="act even while a live run owns the sink (fencing it)"
    )
    parser.add_argument(
        "--live-window",
        type=_duration("--live-window"),
        default=parse_duration(LIVE_WINDOW_DEFAULT, "--live-window"),
        metavar="DURATION",
        help="an owner active this recently is live (default 10m)",
    )
    if confirm:
        parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")


def build_parser() -> Parser:
    parser = Parser(
        prog="twophase",
        parents=[_common(False)],
        description="Operate a twophase staging store (Spark -> PostgreSQL -> "
        "InfluxDB, exactly once).",
    )
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=Parser
    )
    common = _common(True)

    def command(name: str, handler: Callable[[Console], int], text: str) -> Any:
        sub = commands.add_parser(name, parents=[common], help=text, description=text)
        sub.set_defaults(handler=handler)
        return sub

    sub = command("status", cmd_status, "per sink: owner, epochs, staged points, dead letters")
    _sink(sub, required=False)
    sub.add_argument(
        "--live-window",
        type=_duration("--live-window"),
        metavar="DURATION",
        default=parse_duration(LIVE_WINDOW_DEFAULT, "--live-window"),
    )
    sub = command("epochs", cmd_epochs, "one line per epoch (the last 20 by default)")
    _sink(sub)
    _epochs(sub)
    sub.add_argument("--last", type=_count, metavar="N", help="the last N epochs (default 20)")
    sub = command("recover", cmd_recover, "promote every PRECOMMITTED epoch, in order")
    _sink(sub, required=False)
    _guard(sub, confirm=False)
    sub = command("replay", cmd_replay, "re-send retained points of COMMITTED epochs")
    _sink(sub)
    _epochs(sub)
    sub.add_argument("--all", action="store_true", help="every retained COMMITTED epoch")
    _guard(sub, confirm=False)
    sub = command("verify", cmd_verify, "compare the staged points with InfluxDB")
    _sink(sub)
    _epochs(sub)
    sub = command("abort", cmd_abort, "discard a PRECOMMITTED epoch (operator decision)")
    _sink(sub)
    _epochs(sub, single_only=True)
    sub.add_argument("--reason", default="aborted by an operator", metavar="TEXT")
    _guard(sub)
    sub = command("dead-letters", cmd_dead_letters, "list or export rejected rows and points")
    _sink(sub)
    _epochs(sub, single_only=False)
    sub.add_argument("--export", metavar="FILE", help="write all to FILE (.csv or .jsonl)")
    sub.add_argument("--limit", type=_count, default=100, metavar="N", help="0 lists all")
    sub = command("gc", cmd_gc, "remove staged points past retention and orphaned writes")
    _sink(sub, required=False)
    sub.add_argument("--retention", type=_duration("--retention"), metavar="DURATION")
    sub.add_argument("--orphan-grace", type=_duration("--orphan-grace"), metavar="DURATION")
    sub.add_argument("--dry-run", action="store_true", help="count, remove nothing")
    sub.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    sub = command("reset", cmd_reset, "unbind a sink from its query after a checkpoint reset")
    _sink(sub)
    _guard(sub)
    return parser


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = f"twophase: {record.levelname.lower()}: {record.getMessage()}"
        return text if record.name.startswith("twophase") else f"{text} ({record.name})"


@contextmanager
def _logging(debug: bool, stream: TextIO) -> Iterator[None]:
    """twophase's warnings (retries) on stderr; with --debug everything, libraries too.

    Without --debug the connection pool's own reconnect warnings are dropped: the
    error line says what failed, once.
    """
    logger = logging.getLogger() if debug else logging.getLogger("twophase")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(_Formatter())
    quiet, mute = logging.getLogger("psycopg"), logging.NullHandler()
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if debug else logging.WARNING)
    if not debug:
        quiet.addHandler(mute)  # no handler anywhere would mean Python's "last resort" one
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
        quiet.removeHandler(mute)


def _warn_password_flag(console: Console) -> None:
    url = console.args.staging_url
    try:
        has_password = bool(url and make_url(url).password)
    except Exception:  # a bad URL is reported by the configuration step
        has_password = False
    if has_password:
        console.warn(
            "the password in --staging-url is visible to other users (process list, "
            "shell history); prefer TWOPHASE_STAGING_URL or TWOPHASE_STAGING_URL_FILE"
        )


def _fail(console: Console, code: int, message: str) -> int:
    if console.args.debug:
        traceback.print_exc(file=console.err)
    console.err.write(f"twophase: error: {message}\n")
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code (the console script exits with it)."""
    args = build_parser().parse_args(argv)
    console = Console(args, sys.stdout, sys.stderr, sys.stdin)
    with _logging(args.debug, console.err):
        _warn_password_flag(console)
        try:
            return int(args.handler(console))
        except (UsageError, UnknownSinkError, EpochRangeError) as exc:
            return _fail(console, EXIT_USAGE, str(exc))
        except ConfigError as exc:
            if exc.option in CONNECTION_FLAGS:  # given as a flag: wrong usage
                flag = "--" + exc.option.replace("_", "-")
                return _fail(console, EXIT_USAGE, f"{flag}: {exc.problem}")
            return _fail(console, EXIT_FAILED, str(exc))
        except (TwoPhaseError, OSError) as exc:
            return _fail(console, EXIT_FAILED, str(exc))
        except KeyboardInterrupt:
            return _fail(console, 130, "interrupted (the staging store stays consistent)")
        except Exception as exc:  # one line for the operator; --debug shows all
            return _fail(
                console,
                EXIT_FAILED,
                f"unexpected {type(exc).__name__}: {exc} (run with --debug for the traceback)",
            )


if __name__ == "__main__":
    sys.exit(main())
