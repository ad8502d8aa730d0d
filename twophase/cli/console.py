"""Where a command writes: data on stdout (a table or JSON), progress, warnings and
questions on stderr. The operations' [`Hooks`][twophase.operations.hooks.Hooks] end here."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, is_dataclass
from datetime import datetime
from enum import Enum
from typing import Any, TextIO

from twophase.errors import RefusedError, UsageError
from twophase.operations import Guard, Hooks, Progress
from twophase.wording import iso


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, Enum):
        return value.value
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    raise TypeError(f"cannot encode {type(value).__name__}")


def error_json(message: str, setting: str | None, code: int) -> str:
    """An error as the one line of JSON ``--json`` prints on stderr: a line of its own,
    so that a script finds it among warnings and progress lines."""
    data = {"error": message, "setting": setting, "exit_code": code}
    return json.dumps(data, sort_keys=True) + "\n"


class ProgressBar:
    """A progress bar on a terminal; otherwise a plain line at most every ``interval`` s."""

    WIDTH = 24

    def __init__(
        self,
        stream: TextIO,
        label: str,
        total: int,
        unit: str,
        tty: bool,
        interval: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._stream, self._label, self._unit = stream, label, unit
        self._total, self._tty, self._interval, self._clock = total, tty, interval, clock
        self._done, self._shown_at, self._open = 0, float("-inf"), False
        self._shown_done: int | None = None

    def update(self, done: int, note: str = "") -> None:
        self._done = done
        if self._clock() - self._shown_at >= (0.1 if self._tty else self._interval):
            self._show(note)

    def finish(self, note: str = "") -> None:
        if self._tty or self._shown_done != self._done:  # the last state, once
            self._show(note)
        if self._open:
            self._stream.write("\n")
            self._open = False

    def _show(self, note: str) -> None:
        self._shown_at, self._shown_done = self._clock(), self._done
        percent = 100 if self._total <= 0 else min(100, 100 * self._done // self._total)
        count = f"{self._done}/{self._total} {self._unit}" + (f" {note}" if note else "")
        if self._tty:
            fill = self.WIDTH * percent // 100
            bar = "#" * fill + "." * (self.WIDTH - fill)
            self._stream.write(f"\r{self._label} [{bar}] {percent:3d}% {count}\x1b[K")
            self._open = True
        else:
            self._stream.write(f"{self._label}: {count} ({percent}%)\n")
        self._stream.flush()


@dataclass
class Console:
    """The parsed arguments and the three streams of one command."""

    args: argparse.Namespace
    out: TextIO
    err: TextIO
    stdin: TextIO
    _bar: ProgressBar | None = None
    _label: str | None = None

    def emit(self, data: Any, lines: Iterable[str]) -> None:
        """``data`` as JSON with --json, else the lines."""
        if self.args.json:
            json.dump(data, self.out, sort_keys=True, indent=2, default=_json_default)
            self.out.write("\n")
        else:
            self.out.writelines(f"{line}\n" for line in lines)

    def warn(self, text: str) -> None:
        self.err.write(f"twophase: warning: {text}\n")

    def error(self, message: str, setting: str | None, code: int) -> None:
        """The error that ends the command: one line, JSON with --json.

        ``setting`` is the option a configuration error names (``staging_url``).
        """
        if self.args.json:
            self.err.write(error_json(message, setting, code))
        else:
            self.err.write(f"twophase: error: {message}\n")

    def progress(self, step: Progress) -> None:
        """One bar per step label, in turn (verify reads, then queries)."""
        if step.label != self._label or self._bar is None:
            self.finish_progress()
            self._label = step.label
            self._bar = ProgressBar(self.err, step.label, step.total, step.unit, isatty(self.err))
        self._bar.update(step.done, step.note)

    def finish_progress(self) -> None:
        if self._bar is not None:
            self._bar.finish()
            self._bar = None

    def confirm(self, question: str) -> None:
        """Ask on a terminal; refuse without --yes when stdin is not one."""
        if getattr(self.args, "yes", False):
            return
        command = self.command()
        if not isatty(self.stdin):
            raise UsageError(
                f"{command} is destructive and stdin is not a terminal: pass --yes to confirm"
            )
        self.err.write(f"{question}\nProceed? [y/N] ")
        self.err.flush()
        if self.stdin.readline().strip().lower() not in ("y", "yes"):
            raise RefusedError(f"{command}: not confirmed; nothing was changed")

    def command(self) -> str:
        """The command as typed: ``abort``, ``db downgrade``."""
        action = getattr(self.args, "action", None)
        return f"{self.args.command} {action}" if action else str(self.args.command)

    @contextmanager
    def hooks(self) -> Iterator[Hooks]:
        """The operation's hooks; its last progress is shown when it ends, however it ends."""
        try:
            yield Hooks(progress=self.progress, warn=self.warn, confirm=self.confirm)
        finally:
            self.finish_progress()

    def guard(self) -> Guard:
        return Guard(self.args.live_window, getattr(self.args, "force", False))


def isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
