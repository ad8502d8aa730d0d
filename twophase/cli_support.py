"""What the CLI's commands share: output (tables, JSON, progress), confirmation,
configuration from the flags, and the live-run guard.
"""

from __future__ import annotations

import argparse
import getpass
import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, is_dataclass
from datetime import datetime, timezone
from typing import Any, TextIO

from twophase.config import StagingConfig, TwoPhaseConfig, load_config, load_staging_config
from twophase.db import Database
from twophase.errors import TwoPhaseError
from twophase.inspect import EpochRange, Inspector

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
LIVE_WINDOW_DEFAULT = "10m"
CONNECTION_FLAGS = (
    "staging_url",
    "influx_url",
    "influx_api",
    "influx_db",
    "influx_rp",
    "influx_org",
    "influx_bucket",
)


class UsageError(TwoPhaseError):
    """Wrong usage the parser cannot see (exit 2)."""


class Refused(TwoPhaseError):
    """The command will not act: a live run owns the sink, or the operator declined (exit 1)."""


def iso(value: datetime) -> str:
    return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return iso(value)
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    raise TypeError(f"cannot encode {type(value).__name__}")


def cell(value: Any, width: int = 60) -> str:
    """A table cell: '-' for nothing, times to the second, one line, at most ``width``."""
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return iso(value.replace(microsecond=0))
    text = " ".join(str(value).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """Plain aligned columns; the last one is not padded."""
    cells = [[cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    return [
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
        for line in [list(headers), *cells]
    ]


def age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    whole = int(seconds)
    for unit, span, sub, sub_span in (
        ("d", 86400, "h", 3600),
        ("h", 3600, "m", 60),
        ("m", 60, "s", 1),
    ):
        if whole >= span:
            rest = (whole % span) // sub_span
            return f"{whole // span}{unit}" + (f"{rest}{sub}" if rest else "")
    return f"{whole}s"


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def size(octets: int) -> str:
    value = float(octets)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"  # pragma: no cover - unreachable


class Progress:
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


@dataclass(frozen=True)
class Console:
    """Where a command writes: data on ``out``, progress and warnings on ``err``."""

    args: argparse.Namespace
    out: TextIO
    err: TextIO
    stdin: TextIO

    def emit(self, data: dict[str, Any], lines: Iterable[str]) -> None:
        if self.args.json:
            json.dump(data, self.out, sort_keys=True, indent=2, default=_json_default)
            self.out.write("\n")
        else:
            self.out.writelines(f"{line}\n" for line in lines)

    def warn(self, text: str) -> None:
        self.err.write(f"twophase: warning: {text}\n")

    @contextmanager
    def progress(self, label: str, total: int, unit: str) -> Iterator[Progress]:
        bar = Progress(self.err, label, total, unit, isatty(self.err))
        try:
            yield bar
        finally:
            bar.finish()

    def confirm(self, question: str) -> None:
        """Ask on a terminal; refuse without --yes when stdin is not one."""
        if self.args.yes:
            return
        if not isatty(self.stdin):
            raise UsageError(
                f"{self.args.command} is destructive and stdin is not a terminal: "
                "pass --yes to confirm"
            )
        self.err.write(f"{question}\nProceed? [y/N] ")
        self.err.flush()
        if self.stdin.readline().strip().lower() not in ("y", "yes"):
            raise Refused(f"{self.args.command}: not confirmed; nothing was changed")


def isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Phases:
    """Progress of a command in phases (verify): one bar per phase, in turn."""

    def __init__(self, console: Console):
        self._console = console
        self._phase: str | None = None
        self._bar: Progress | None = None

    def __call__(self, phase: str, unit: str, done: int, total: int) -> None:
        if phase != self._phase or self._bar is None:
            self.close()
            self._phase = phase
            self._bar = Progress(self._console.err, phase, total, unit, isatty(self._console.err))
        self._bar.update(done)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.finish()
            self._bar = None


def full_config(args: argparse.Namespace) -> TwoPhaseConfig:
    return load_config(**{name: getattr(args, name) for name in CONNECTION_FLAGS})


def staging_config(args: argparse.Namespace) -> StagingConfig:
    return load_staging_config(staging_url=args.staging_url)


@contextmanager
def open_store(args: argparse.Namespace) -> Iterator[tuple[Database, Inspector]]:
    with Database(staging_config(args)) as db:
        yield db, Inspector(db)


def actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no user name in a bare container
        return "cli:unknown"


def selection_of(args: argparse.Namespace) -> EpochRange | None:
    """--epoch N or --from A / --to B; None when none of them was given."""
    first, last = getattr(args, "first", None), getattr(args, "last_epoch", None)
    if args.epoch is not None:
        if first is not None or last is not None:
            raise UsageError("--epoch cannot be combined with --from/--to")
        return EpochRange(args.epoch, args.epoch)
    if first is None and last is None:
        return None
    if first is not None and last is not None and first > last:
        raise UsageError(f"--from {first} is after --to {last}")
    return EpochRange(first, last)


def refuse_if_live(
    console: Console, inspector: Inspector, sinks: Sequence[str], action: str
) -> None:
    """Refuse to act on a sink a live run owns (it would be fenced or raced), unless --force."""
    window = console.args.live_window
    for sink in sinks:
        owner = inspector.live_owner(sink, window)
        if owner is None:
            continue
        run_id, active_at = owner
        idle = max(0.0, (datetime.now(timezone.utc) - active_at).total_seconds())
        what = (
            f"sink {sink!r} is owned by run {run_id}, active {age(idle)} ago "
            f"(within --live-window {age(window)})"
        )
        if not console.args.force:
            raise Refused(
                f"{what}: {action} would fence or race it; stop its query first, or pass --force"
            )
        console.warn(f"{what}; going ahead because of --force")
