"""The CLI's arguments, tables, progress and helpers (no servers)."""

from __future__ import annotations

import io
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from twophase.cli import build_parser, main
from twophase.cli.commands import selection_of
from twophase.cli.console import ProgressBar
from twophase.cli.render import cell, size, table
from twophase.errors import UsageError
from twophase.operations.store import export_format
from twophase.store.views import EpochRange
from twophase.wording import age, compact_ranges, epochs_are


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_table_aligns_and_shows_nothing_as_dash() -> None:
    when = datetime(2024, 5, 1, 12, 0, 3, 999, tzinfo=timezone(timedelta(hours=2)))
    assert table(("A", "LONGER"), [(1, None), ("xyz", when)]) == [
        "A    LONGER",
        "1    -",
        "xyz  2024-05-01T10:00:03Z",
    ]
    assert cell("a\nb   c") == "a b c"
    assert cell("x" * 100, 10) == "xxxxxxx..."


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (0, "0s"),
        (59.9, "59s"),
        (60, "1m"),
        (600, "10m"),
        (3725, "1h2m"),
        (7 * 86400, "7d"),
        (90000, "1d1h"),
    ],
)
def test_age(seconds: float | None, text: str) -> None:
    assert age(seconds) == text


def test_size() -> None:
    assert [size(n) for n in (0, 1023, 1024, 5 * 2**20, 3 * 2**40)] == [
        "0 B",
        "1023 B",
        "1.0 KiB",
        "5.0 MiB",
        "3072.0 GiB",
    ]


def test_compact_ranges_and_epochs_are() -> None:
    assert compact_ranges([8, 0, 1, 2, 5, 7, 2]) == "0-2, 5, 7-8"
    assert compact_ranges([]) == ""
    assert epochs_are([4]) == "epoch 4 is"
    assert epochs_are([4, 5]) == "epochs 4-5 are"


def test_progress_off_a_terminal_prints_plain_lines_now_and_then() -> None:
    out, clock = io.StringIO(), Clock()
    bar = ProgressBar(out, "resend", 100, "points", tty=False, interval=2.0, clock=clock)
    bar.update(10, "epoch 0")
    clock.now = 1.0
    bar.update(50)  # too soon: not shown
    clock.now = 3.0
    bar.update(60)
    bar.finish()  # 60 was just shown: not again
    clock.now = 3.5
    bar.update(100)  # too soon
    bar.finish()  # the last state is always shown once
    assert out.getvalue().splitlines() == [
        "resend: 10/100 points epoch 0 (10%)",
        "resend: 60/100 points (60%)",
        "resend: 100/100 points (100%)",
    ]


def test_progress_on_a_terminal_redraws_one_line() -> None:
    out, clock = io.StringIO(), Clock()
    bar = ProgressBar(out, "gc", 4, "sinks", tty=True, clock=clock)
    bar.update(1)
    clock.now = 1.0
    bar.update(4)
    bar.finish()
    frames = out.getvalue().split("\r")[1:]
    assert frames[0] == "gc [######" + "." * 18 + "]  25% 1/4 sinks\x1b[K"
    assert out.getvalue().endswith("100% 4/4 sinks\x1b[K\n")
    assert ProgressBar(io.StringIO(), "x", 0, "u", tty=False).finish() is None  # total 0: no crash


def parse(*argv: str) -> Any:
    return build_parser().parse_args(list(argv))


def test_global_flags_before_or_after_the_command() -> None:
    before = parse("--json", "--influx-db", "a", "verify", "--sink", "s")
    after = parse("verify", "--sink", "s", "--json", "--influx-db", "b")
    assert (before.json, before.influx_db) == (True, "a")
    assert (after.json, after.influx_db) == (True, "b")
    neither = parse("--influx-db", "a", "recover")  # a command's copy does not reset it
    assert (neither.json, neither.influx_db) == (False, "a")
    assert parse("--influx-db", "a", "status").influx_db == "a"  # before: every command
    assert parse("recover").live_window == 600.0
    assert parse("gc", "--retention", "36h").retention == 36 * 3600


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["gc", "--retention", "7x"], "twophase gc: error: argument --retention: '7x' is not a"),
        (["epochs", "--sink", "s", "--epoch", "x"], "argument --epoch: 'x' is not an epoch"),
        (["abort", "--sink", "s"], "the following arguments are required: --epoch"),
        (["resend", "--sink", "s", "--all", "--epoch", "1"], "cannot be combined"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def testselection_of() -> None:
    assert selection_of(parse("epochs", "--sink", "s")) is None
    assert selection_of(parse("epochs", "--sink", "s", "--epoch", "3")) == EpochRange(3, 3)
    assert selection_of(parse("verify", "--sink", "s", "--from", "2")) == EpochRange(2, None)
    assert selection_of(parse("verify", "--sink", "s", "--to", "2")) == EpochRange(None, 2)
    with pytest.raises(UsageError, match="--from 5 is after --to 1"):
        selection_of(parse("verify", "--sink", "s", "--from", "5", "--to", "1"))
    assert EpochRange(2, None).describe() == "epochs 2.."
    assert EpochRange().describe() == "all epochs"


def test_export_format_by_extension() -> None:
    assert export_format("x.CSV") == "csv"
    assert export_format("dir/x.ndjson") == "jsonl"
    with pytest.raises(UsageError, match="--export"):
        export_format("x.txt")
