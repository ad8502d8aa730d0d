"""Where a command writes: data on stdout (a table or JSON), progress, warnings and
questions on stderr. The operations' [`Hooks`][twophase.operations.hooks.Hooks] end here.

Text written for a person passes through [`printable`][twophase.cli.console.printable]
first: a dead letter's payload or reason, a server's error, a sink's last error can hold
terminal control sequences (an ESC sequence that moves the cursor or hides text, an OSC
52 sequence that writes the operator's clipboard), shown escaped and never acted on.
"""

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

# C0 controls (tab and line breaks too), DEL and the C1 controls, each as an escape:
# ESC (\x1b) and CSI (\x9b) start the sequences a terminal acts on.
_CONTROLS: dict[int, str] = {
    code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0))
} | {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}


def printable(text: str) -> str:
    """``text`` with every control character escaped as Python writes it (``\\x1b``,
    ``\\n``): safe to write to a terminal, on one line."""
    return text.translate(_CONTROLS)


def json_chunks(data: Any, indent: int | None = None) -> Iterator[str]:
    """``data`` as JSON (sorted keys), in pieces, every control character escaped: the
    encoder escapes C0 and (ASCII only) C1, DEL is escaped here (it can only be inside
    a string, which is one piece)."""
    encoder = json.JSONEncoder(sort_keys=True, indent=indent, default=_json_default)
    for chunk in encoder.iterencode(data):
        yield chunk.replace("\x7f", "\\u007f")


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, Enum):
        return value.value
    if hasattr(value, "as_json"):
        return value.as_json()
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    raise TypeError(f"cannot encode {type(value).__name__}")


def error_json(message: str, setting: str | None, code: int) -> str:
    """An error as the one line of JSON ``--json`` prints on stderr: a line of its own,
    so that a script finds it among warnings and progress lines."""
    data = {"error": message, "setting": setting, "exit_code": code}
    return "".join(json_chunks(data)) + "\n"


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
        self._stream, self._label, self._unit = stream, printable(label), printable(unit)
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
        count = f"{self._done}/{self._total} {self._unit}" + (f" {printable(note)}" if note else "")
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
            self.out.writelines(json_chunks(data, indent=2))
            self.out.write("\n")
        else:
            self.out.writelines(f"{printable(line)}\n" for line in lines)

    def warn(self, text: str) -> None:
        self.err.write(f"twophase: warning: {printable(text)}\n")

    def error(self, message: str, setting: str | None, code: int) -> None:
        """The error that ends the command: one line, JSON with --json.

        ``setting`` is the option a configuration error names (``staging_url``).
        """
        if self.args.json:
            self.err.write(error_json(message, setting, code))
        else:
            self.err.write(f"twophase: error: {printable(message)}\n")

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
        self.err.write(f"{printable(question)}\nProceed? [y/N] ")
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
