"""The CLI's arguments, tables, progress and helpers (no servers)."""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import os
import stat
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import FakeClock
from twophase.cli import _Formatter, build_parser, main
from twophase.cli.commands import selection_of
from twophase.cli.console import Console, ProgressBar, printable
from twophase.cli.render import cell, dead_letter_lines, size, table
from twophase.errors import UsageError
from twophase.model import DeadLetter, Phase
from twophase.operations.store_only import DeadLetterListing, _export, csv_cell, export_format
from twophase.store.views import EpochRange
from twophase.wording import age, compact_ranges, epochs_are


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
    out, clock = io.StringIO(), FakeClock(0.0)
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
    out, clock = io.StringIO(), FakeClock(0.0)
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


# --- terminal control characters in what the CLI prints --------------------------------

ESC_SEQUENCE = "\x1b[2J\x1b[1;1H\x1b[8mhidden\x1b[0m"  # clear the screen, hide text
OSC_52 = "\x1b]52;c;cm0gLXJmIH4K\x07"  # set the clipboard to "rm -rf ~"
C1_AND_DEL = "\x9b31mred\x9d0;title\x9c\x7f"  # 8-bit CSI and OSC, ST, DEL
CONTROLS = {chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))}


def harmless(text: str) -> bool:
    return not CONTROLS & set(text)


def harmless_output(text: str) -> bool:
    """No control character but the line feeds that end the lines."""
    return all(harmless(line) for line in text.split("\n"))


def letter(reason: str, payload: str) -> DeadLetter:
    return DeadLetter("s", 3, "0123456789abcdef", 0, Phase.PROMOTE, reason, payload, 1)


def console(json_output: bool = False) -> Console:
    args = argparse.Namespace(json=json_output, command="dead-letters")
    return Console(args, io.StringIO(), io.StringIO(), io.StringIO())


@pytest.mark.parametrize("text", [ESC_SEQUENCE, OSC_52, C1_AND_DEL])
def test_printable_escapes_every_control_character(text: str) -> None:
    shown = printable(text)
    assert harmless(shown) and ("\\x1b" in shown or "\\x9b" in shown)
    assert printable(shown) == shown  # escaping twice changes nothing
    assert printable("a\tb\nc\r") == "a\\tb\\nc\\r"
    assert printable("ünï ☃ 𝄞 \\x") == "ünï ☃ 𝄞 \\x"  # printable text as it is


def test_a_dead_letter_cannot_drive_the_terminal() -> None:
    listing = DeadLetterListing(2, (letter(ESC_SEQUENCE, OSC_52), letter(OSC_52, C1_AND_DEL)))
    lines = dead_letter_lines("s", listing)
    assert all(harmless(line) for line in lines), lines
    assert "\\x1b]52;c;cm0gLXJmIH4K\\x07" in lines[1]  # shown, escaped, in its cell
    assert "\\x1b[2J\\x1b[1;1H" in lines[1]
    assert "\\x9b31mred" in lines[2]
    con = console()
    con.emit(listing, lines)
    assert harmless_output(con.out.getvalue())


def test_a_cell_is_measured_after_escaping() -> None:
    assert cell(OSC_52, 12) == "\\x1b]52;c..."
    assert table(("A", "B"), [("\x1b[31m", "x")]) == ["A         B", "\\x1b[31m  x"]


def test_free_text_lines_warnings_errors_and_progress_are_escaped() -> None:
    con = console()
    con.emit({}, [f"exported 1 dead letter of sink {OSC_52}"])
    con.warn(f"the server said {ESC_SEQUENCE}")
    con.error(f"InfluxDB refused: {OSC_52}", None, 1)
    bar = ProgressBar(con.err, f"verify {C1_AND_DEL}", 2, "points", tty=True)
    bar.update(1, OSC_52)
    bar.finish()
    assert harmless_output(con.out.getvalue()), con.out.getvalue()
    # The bar's own carriage return and erase-line sequence are all the controls left.
    shown = con.err.getvalue().replace("\r", "").replace("\x1b[K", "")
    assert harmless_output(shown), shown
    assert "twophase: error: InfluxDB refused: \\x1b]52;c;cm0gLXJmIH4K\\x07" in shown


def test_log_lines_are_escaped() -> None:
    record = logging.LogRecord("twophase.x", logging.WARNING, __file__, 1, "%s", (OSC_52,), None)
    assert _Formatter().format(record) == ("twophase: warning: \\x1b]52;c;cm0gLXJmIH4K\\x07")


def test_json_output_escapes_control_characters_and_keeps_the_text() -> None:
    con = console(json_output=True)
    listing = DeadLetterListing(1, (letter(ESC_SEQUENCE, OSC_52 + C1_AND_DEL),))
    con.emit(listing, [])
    con.error(OSC_52, None, 1)
    out, err = con.out.getvalue(), con.err.getvalue()
    assert harmless_output(out) and harmless_output(err)
    (got,) = json.loads(out)["dead_letters"]
    assert (got["reason"], got["payload"]) == (ESC_SEQUENCE, OSC_52 + C1_AND_DEL)
    assert json.loads(err)["error"] == OSC_52


# --- the dead-letter export file -------------------------------------------------------


def letters() -> list[DeadLetter]:
    return [
        letter('=HYPERLINK("http://evil.example","click")', "=1+1"),
        letter("fine", "+cmd|' /C calc'!A0"),
        letter("-2+3", "@SUM(A1)"),
        letter("\tx", "\r=1"),
        letter("a=1", "m v=1 1"),
    ]


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_the_export_is_written_with_mode_0600(tmp_path: Path) -> None:
    old = os.umask(0o022)  # the usual umask, which would leave it readable by everyone
    try:
        for name in ("dl.csv", "dl.jsonl"):
            target = tmp_path / name
            assert _export(letters(), target, "csv" if name.endswith(".csv") else "jsonl") == 5
            assert stat.S_IMODE(target.stat().st_mode) == 0o600
    finally:
        os.umask(old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dl.csv", "dl.jsonl"]  # no partial


def test_the_export_follows_no_symlink_planted_at_the_old_partial_name(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    planted = tmp_path / ".dl.csv.partial"  # the fixed name earlier versions wrote to
    planted.symlink_to(victim)
    target = tmp_path / "dl.csv"
    _export(letters(), target, "csv")
    assert victim.read_text() == "precious\n"
    assert planted.is_symlink() and not target.is_symlink()
    assert len(read_csv(target)) == 5


def test_the_export_replaces_a_symlink_at_the_target_not_what_it_points_to(
    tmp_path: Path,
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    target = tmp_path / "dl.jsonl"
    target.symlink_to(victim)
    _export(letters(), target, "jsonl")
    assert victim.read_text() == "precious\n" and not target.is_symlink()
    assert len(target.read_text().splitlines()) == 5


def test_a_failed_export_leaves_no_file(tmp_path: Path) -> None:
    def rows() -> Any:
        yield letters()[0]
        raise OSError("the store went away")

    with pytest.raises(OSError, match="went away"):
        _export(rows(), tmp_path / "dl.csv", "csv")
    assert list(tmp_path.iterdir()) == []


def test_csv_cells_that_start_a_formula_get_a_quote_first(tmp_path: Path) -> None:
    target = tmp_path / "dl.csv"
    _export(letters(), target, "csv")
    rows = read_csv(target)
    assert [r["payload"] for r in rows] == [
        "'=1+1",
        "'+cmd|' /C calc'!A0",
        "'@SUM(A1)",
        "'\r=1",
        "m v=1 1",
    ]
    assert [r["reason"] for r in rows] == [
        '\'=HYPERLINK("http://evil.example","click")',
        "fine",
        "'-2+3",
        "'\tx",
        "a=1",
    ]
    assert {r["epoch"] for r in rows} == {"3"}


def test_only_text_cells_are_guarded_and_jsonl_keeps_values_as_stored(tmp_path: Path) -> None:
    assert csv_cell(-3) == -3  # a correction's epoch is a number, not a formula
    assert csv_cell(None) is None and csv_cell("x=1") == "x=1"
    target = tmp_path / "dl.jsonl"
    _export(letters(), target, "jsonl")
    first = json.loads(target.read_text().splitlines()[0])
    assert first["payload"] == "=1+1"


def test_a_requeue_in_batches_names_its_corrections_and_adds_up_their_points() -> None:
    from twophase.cli.render import requeue_lines
    from twophase.operations import RequeueReport
    from twophase.protocol.commit.promoter import PromoteResult

    done = [PromoteResult("s", -n, 500 - n, n) for n in (1, 2, 3)]
    pending = PromoteResult("s", 7, 10, 0)
    report = RequeueReport("s", False, 1, 1500, (4, 5), 0, (pending, *done), (1, 2, 3))
    assert requeue_lines(report) == [
        "promoted first (they were pending): epoch 7",
        "requeued 1500 dead letters of epochs 4-5 as corrections c1-c3: 1494 delivered, "
        "6 rejected again",
        "the points rejected again are dead letters of the corrections",
    ]
    one = RequeueReport("s", True, 4, 3, (9,), 0)
    assert requeue_lines(one) == [
        "would requeue 3 dead letters of epoch 9 as correction c4 (dry run: nothing sent)"
    ]
