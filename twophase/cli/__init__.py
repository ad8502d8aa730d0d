"""``twophase``: the operator's command line for a twophase staging store.

Commands: status, epochs, verify, dead-letters, recover, resend, abort, gc,
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
status ``sinks`` (objects with the fields of :class:`twophase.store.views.SinkStatus`);
epochs ``sink_id``, ``epochs`` (fields of ``EpochInfo``), ``events`` (with one
``--epoch``); recover ``recovered`` (``sink_id``, ``epoch``, ``delivered``,
``rejected``); resend ``sink_id``, ``resent`` (``sink_id``, ``epoch``,
``points_sent``, ``points_rejected``), ``skipped_aborted``, ``skipped_purged``; verify ``sink_id``,
``epochs``, ``points``, ``series``, ``unparseable``, ``ok``, ``differences``
(fields of :class:`twophase.operations.verify.SeriesDiff`), ``notes``; abort and reset
``sink_id`` and what was done; dead-letters ``total`` and ``dead_letters``
(fields of :class:`twophase.model.DeadLetter`) or ``exported`` and ``file``; gc ``dry_run``,
``retention_s``, ``orphan_grace_s``, ``sinks`` and the totals.

Layout: every command is an operation of :mod:`twophase.operations`, which
returns data; this package only parses (:mod:`.parser`), calls
(:mod:`.commands`) and renders (:mod:`.render`, :mod:`.console`). This
module maps errors to exit codes.
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TextIO

from twophase.cli import commands as cmd
from twophase.cli.console import Console
from twophase.cli.parser import build_parser
from twophase.config import CLI_FLAGS
from twophase.errors import (
    ConfigError,
    EpochRangeError,
    TwoPhaseError,
    UnknownSinkError,
    UsageError,
)
from twophase.store.urls import has_password

__all__ = ["build_parser", "main"]


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
    if url and has_password(url):  # a bad URL is reported by the configuration step
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
            return _fail(console, cmd.EXIT_USAGE, str(exc))
        except ConfigError as exc:
            if exc.option in CLI_FLAGS:  # given as a flag: wrong usage
                flag = "--" + exc.option.replace("_", "-")
                return _fail(console, cmd.EXIT_USAGE, f"{flag}: {exc.problem}")
            return _fail(console, cmd.EXIT_FAILED, str(exc))
        except (TwoPhaseError, OSError) as exc:
            return _fail(console, cmd.EXIT_FAILED, str(exc))
        except KeyboardInterrupt:
            return _fail(console, 130, "interrupted (the staging store stays consistent)")
        except Exception as exc:  # one line for the operator; --debug shows all
            return _fail(
                console,
                cmd.EXIT_FAILED,
                f"unexpected {type(exc).__name__}: {exc} (run with --debug for the traceback)",
            )


if __name__ == "__main__":
    sys.exit(main())
