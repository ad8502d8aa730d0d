"""``twophase``: the operator's command line for a twophase staging store.

Commands: status, epochs, verify, dead-letters, recover, resend, targets (and
targets resync and remove), abort, gc, reset, metrics serve, and db (upgrade, downgrade,
current, history, grants) for the staging schema (``twophase COMMAND --help`` for
each). Settings come from the ``TWOPHASE_*`` variables (see
[`twophase.config`][twophase.config]); the connection flags override them: every one before
the command, and after it those of the servers the command talks to. Secrets
(a target's password or token, a database password) come only from the
environment or ``*_FILE`` files, never from a flag.

Exit codes: 0 success; 1 a failure the one-line message on stderr explains (a
server unreachable, a setting missing from the environment, a refusal while a
live run owns the sink, a declined confirmation); 2 wrong usage (bad flags,
unknown sink, an epoch that is not recorded, a malformed duration, a revision
that cannot work, a destructive command without ``--yes`` when stdin is not a
terminal). ``verify`` answers a question and exits as ``diff`` does: 0 the
targets hold exactly the staged points, 1 a target differs, 2 no answer (wrong
usage or any failure: 1 would read as "it differs"). 130 when interrupted.
Tracebacks only with --debug.

``--json`` prints one JSON object on stdout (sorted keys, indented; times as ISO-8601 UTC
``...Z`` strings, durations in seconds). Top-level keys: status ``sinks`` (objects with the
fields of [`twophase.store.views.SinkStatus`][twophase.store.views.SinkStatus], and
``targets`` for a sink with several targets: objects with the keys of
[`TargetState.as_dict`][twophase.protocol.ledger.target_ledger.TargetState.as_dict]); targets
``targets`` (the same objects with ``sink_id``); targets resync ``sink_id``, ``target``,
``from_epoch``, ``delivered``, ``skipped_purged`` (epochs GC purged: not supplied), ``state``,
``promoted``; targets remove ``sink_id``, ``target``, ``state``, ``delivered_epoch``,
``backlog_epochs``, ``backlog_corrections``, ``backlog_bytes``, ``deliveries``, ``dead_letters``,
``corrections`` (the corrections owed to it alone, deleted with it), ``remaining`` (the sink's
targets after it) and ``still_configured`` (the configuration still named it: removed with
``--force``); epochs ``sink_id``, ``epochs`` (fields of ``EpochInfo``), ``events`` (with one
``--epoch``); recover ``recovered`` (``sink_id``, ``epoch``, ``delivered``, ``rejected``); resend
``sink_id``, ``resent`` (``sink_id``, ``epoch``, ``points_sent``, ``points_rejected``),
``skipped_aborted``, ``skipped_purged`` (and ``target`` with ``--target``); verify
``sink_id``, ``epochs``, ``points``, ``series``, ``unparseable``, ``ok``, ``differences``
(fields of [`verify.SeriesDiff`][twophase.operations.verify.SeriesDiff]), ``notes`` (and
``target`` with ``--target``; with several targets and no ``--target``: ``sink_id``, ``ok``
and ``targets``, one such object per target); abort and reset ``sink_id`` and what was done;
dead-letters ``total`` and ``dead_letters`` (fields of
[`twophase.model.DeadLetter`][twophase.model.DeadLetter]) or ``exported`` and ``file``; gc
``dry_run``, ``retention_s``, ``orphan_grace_s``, ``sinks`` and the totals; db upgrade,
downgrade and current ``url``, ``before``, ``after``, ``head``, ``at_head``; db history
``url``, ``current``, ``head``, ``revisions`` (oldest first, fields of
[`migrate.SchemaRevision`][twophase.operations.migrate.SchemaRevision]); db upgrade and
downgrade with ``--sql`` ``action``, ``start``, ``target`` (null: no schema) and ``sql``; db
grants ``schema``, ``roles`` (the role of each kind, null: none) and ``sql``, with
``--apply`` ``url``, ``schema``, ``roles`` and ``statements`` (those run).

With ``--json`` an error is JSON too: one line on stderr (after any warning or
progress line), the object ``{"error": message, "setting": option, "exit_code":
code}``, where ``setting`` is the option a configuration error names
(``staging_url``, whether the message says ``--staging-url``,
``TWOPHASE_STAGING_URL`` or ``TWOPHASE_STAGING_URL_FILE``) and null for other errors.

Layout: every command is an operation of [`twophase.operations`][twophase.operations], which
returns data; this package only parses ([`twophase.cli.parser`][twophase.cli.parser]), calls
([`twophase.cli.commands`][twophase.cli.commands]) and renders
([`twophase.cli.render`][twophase.cli.render], [`twophase.cli.console`][twophase.cli.console]). This
module maps errors to exit codes.
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TextIO

import psycopg

from twophase import logs
from twophase.cli import commands as cmd
from twophase.cli.console import Console, printable
from twophase.cli.parser import build_parser
from twophase.config import ALIASES, CLI_ALIASES, CLI_FLAGS, CONFIG_FILE_ENV, OPTIONS, env_name
from twophase.config.urls import has_password
from twophase.errors import (
    ConfigError,
    EpochRangeError,
    TwoPhaseError,
    UnknownSinkError,
    UsageError,
)

__all__ = ["build_parser", "main"]


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = f"twophase: {record.levelname.lower()}: {printable(record.getMessage())}"
        return text if record.name.startswith("twophase") else f"{text} ({record.name})"


@contextmanager
def _logging(debug: bool, stream: TextIO, fmt: str = logs.TEXT) -> Iterator[None]:
    """twophase's warnings (retries) on stderr; with --debug everything, libraries too.

    Without --debug the connection pool's own reconnect warnings are dropped: the
    error line says what failed, once. With ``--log-format json`` each line is a JSON
    object ([`twophase.logs`][twophase.logs]).
    """
    logger = logging.getLogger() if debug else logging.getLogger("twophase")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(_Formatter() if fmt == logs.TEXT else logs.formatter(fmt))
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
    """Once per command: a flag's value is in the process list (``ps``) for every user of
    the machine to read, and in the shell's history. The password is never shown."""
    url = console.args.staging_url
    if url and has_password(url):  # a bad URL is reported by the configuration step
        var = env_name("staging_url")
        console.warn(
            "the password in --staging-url is visible to other users (process list, "
            f"shell history): give the setting staging_url as {var}, in the file "
            f"{var}_FILE names, or in the TOML file {CONFIG_FILE_ENV} names (or the "
            "password alone in PGPASSWORD or ~/.pgpass)"
        )


@dataclass(frozen=True)
class _Failure:
    """How a command ended when it raised: the exit code, the message, and the option
    a configuration error names (``staging_url``; None for other errors)."""

    code: int
    message: str
    setting: str | None = None


# The names a ConfigError gives a setting under: the option, its variable, the
# variable of a file that holds a secret; its aliases' too (told as the option).
_NAMES = {name: name for name in OPTIONS} | ALIASES
_SETTINGS = (
    _NAMES
    | {env_name(name): option for name, option in _NAMES.items()}
    | {env_name(name) + "_FILE": option for name, option in _NAMES.items()}
)


def _failure(exc: Exception, failed: int) -> _Failure:
    """The exit code and message of an error; ``failed`` is the command's code for a
    failure (1; verify's is 2, its 1 meaning that a target differs)."""
    if isinstance(exc, UsageError | UnknownSinkError | EpochRangeError):
        return _Failure(cmd.EXIT_USAGE, str(exc))
    if isinstance(exc, ConfigError):
        setting = _SETTINGS.get(exc.option, exc.option)
        if exc.option in (*CLI_FLAGS, *CLI_ALIASES):  # given as a flag: wrong usage
            flag = "--" + exc.option.replace("_", "-")
            return _Failure(cmd.EXIT_USAGE, f"{flag}: {exc.problem}", setting)
        return _Failure(failed, str(exc), setting)
    if isinstance(exc, TwoPhaseError | OSError):
        return _Failure(failed, str(exc))
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else "permission denied"
        return _Failure(
            failed,
            f"the staging store refused: {reason} (the role of the staging URL lacks a grant:"
            " `twophase db grants` shows what each kind of process needs)",
        )
    return _Failure(
        failed, f"unexpected {type(exc).__name__}: {exc} (run with --debug for the traceback)"
    )


def _fail(console: Console, failure: _Failure) -> int:
    if console.args.debug:  # the traceback quotes messages too: escaped like every line
        console.err.writelines(
            f"{printable(line)}\n" for line in traceback.format_exc().splitlines()
        )
    console.error(failure.message, failure.setting, failure.code)
    return failure.code


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code (the console script exits with it)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    # Known before parsing, so that argparse's own usage errors can be JSON too.
    args = build_parser(json_errors="--json" in arguments).parse_args(arguments)
    console = Console(args, sys.stdout, sys.stderr, sys.stdin)
    with _logging(args.debug, console.err, args.log_format):
        _warn_password_flag(console)
        try:
            return int(args.handler(console))
        except KeyboardInterrupt:
            return _fail(console, _Failure(130, "interrupted (the staging store stays consistent)"))
        except Exception as exc:  # one line for the operator; --debug shows all
            return _fail(console, _failure(exc, args.failed))


if __name__ == "__main__":
    sys.exit(main())
