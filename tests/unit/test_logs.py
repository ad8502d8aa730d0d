"""Log lines: the text and JSON forms with their sink, epoch and run, the missing JSON
extra, the library's silence until an entry point configures it, and the protocol's log
calls carrying their context."""

from __future__ import annotations

import ast
import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from twophase import logs
from twophase.cli import _logging, build_parser
from twophase.errors import ConfigError
from twophase.model import Lease

REPO = Path(__file__).resolve().parents[2]
LEASE = Lease("events", "ab12cd", "q1", 7)
# The modules whose every log line is about a sink, an epoch or a run.
PROTOCOL_LOGGERS = [
    *sorted((REPO / "twophase" / "protocol").rglob("*.py")),
    REPO / "twophase" / "spark" / "driver_commit.py",
]


@pytest.fixture
def twophase_logger() -> Iterator[logging.Logger]:
    """The ``twophase`` logger, its handlers and level restored after the test."""
    logger = logging.getLogger("twophase")
    handlers, level = list(logger.handlers), logger.level
    yield logger
    for handler in [h for h in logger.handlers if h not in handlers]:
        logger.removeHandler(handler)
    logger.setLevel(level)


def committed(epoch: int = 3) -> None:
    """A line as the promoter writes it."""
    logging.getLogger("twophase.protocol.promoter").info(
        "sink %s epoch %d committed: %d delivered, %d rejected",
        LEASE.sink_id,
        epoch,
        10,
        0,
        extra=logs.lease_fields(LEASE, epoch),
    )


def test_json_lines_carry_sink_epoch_and_run_as_keys(twophase_logger: logging.Logger) -> None:
    out = io.StringIO()
    logs.configure("json", stream=out)
    committed()
    (line,) = out.getvalue().splitlines()
    record = json.loads(line)
    assert record["sink_id"] == "events"
    assert record["epoch"] == 3
    assert record["run_id"] == "ab12cd"
    assert record["level"] == "INFO"
    assert record["logger"] == "twophase.protocol.promoter"
    assert record["message"] == "sink events epoch 3 committed: 10 delivered, 0 rejected"
    assert record["time"].endswith("Z")


def test_text_lines_show_the_context_compactly(twophase_logger: logging.Logger) -> None:
    out = io.StringIO()
    logs.configure("text", stream=out)
    committed()
    committed(epoch=-2)  # a correction
    logging.getLogger("twophase.retry").warning("no context here")
    first, correction, plain = out.getvalue().splitlines()
    assert first.endswith(
        " INFO twophase.protocol.promoter: sink events epoch 3 committed: 10 delivered, "
        "0 rejected [sink=events epoch=3 run=ab12cd]"
    )
    assert first[:20].count("-") == 2 and first.split(" ")[0].endswith("Z")  # UTC, ISO-8601
    assert correction.endswith("[sink=events epoch=c2 run=ab12cd]")
    assert plain.endswith("WARNING twophase.retry: no context here")


def test_fields_leave_out_what_is_not_known() -> None:
    assert logs.fields("events") == {"sink_id": "events"}
    assert logs.fields("events", 0) == {"sink_id": "events", "epoch": 0}
    assert logs.lease_fields(LEASE) == {"sink_id": "events", "run_id": "ab12cd"}


def test_configure_sets_info_on_twophase_only_and_replaces_its_handler(
    twophase_logger: logging.Logger,
) -> None:
    spark = logging.getLogger("py4j")
    spark_state = (list(spark.handlers), spark.level)
    root_handlers = list(logging.getLogger().handlers)
    first, second = io.StringIO(), io.StringIO()
    logs.configure("text", stream=first)
    logs.configure("text", stream=second)
    logging.getLogger("twophase.protocol.committer").debug("not shown at INFO")
    committed()
    assert first.getvalue() == ""
    assert len(second.getvalue().splitlines()) == 1  # one handler: no doubled lines
    assert twophase_logger.level == logging.INFO
    assert (list(spark.handlers), spark.level) == spark_state
    assert logging.getLogger().handlers == root_handlers


def test_json_without_python_json_logger_names_the_option_and_the_extra(
    twophase_logger: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    handlers = list(twophase_logger.handlers)
    monkeypatch.setitem(sys.modules, "pythonjsonlogger", None)  # import raises ImportError
    monkeypatch.setitem(sys.modules, "pythonjsonlogger.json", None)
    with pytest.raises(ConfigError) as caught:
        logs.configure("json")
    assert caught.value.option == "log_format"
    assert "twophase[json-logs]" in str(caught.value)
    assert twophase_logger.handlers == handlers  # nothing attached


def test_an_unknown_format_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="log_format: 'xml' is not a log format"):
        logs.formatter("xml")


def test_import_twophase_adds_only_a_null_handler() -> None:
    probe = (
        "import logging, sys, twophase; "
        "t = logging.getLogger('twophase'); "
        "print([type(h).__name__ for h in t.handlers], t.level, "
        "len(logging.getLogger().handlers), 'pythonjsonlogger' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert done.stdout.strip() == "['NullHandler'] 0 0 False"


@pytest.mark.parametrize("path", PROTOCOL_LOGGERS, ids=lambda p: p.name)
def test_every_protocol_log_call_passes_its_context(path: Path) -> None:
    calls = [
        node
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "log"
    ]
    bare = [node.lineno for node in calls if not any(k.arg == "extra" for k in node.keywords)]
    assert bare == []


def test_the_cli_logs_json_lines_with_log_format_json(twophase_logger: logging.Logger) -> None:
    assert build_parser().parse_args(["status", "--log-format", "json"]).log_format == "json"
    assert build_parser().parse_args(["status"]).log_format == "text"
    err = io.StringIO()
    with _logging(False, err, "json"):
        logging.getLogger("twophase.retry").info("not shown without --debug")
        logging.getLogger("twophase.retry").warning("retrying", extra=logs.fields("events"))
    (line,) = err.getvalue().splitlines()
    assert json.loads(line)["message"] == "retrying"
    assert json.loads(line)["sink_id"] == "events"


def test_the_cli_refuses_json_logs_without_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "pythonjsonlogger", None)
    monkeypatch.setitem(sys.modules, "pythonjsonlogger.json", None)
    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(["--log-format", "json", "status"])
    assert caught.value.code == 2
    assert "twophase[json-logs]" in capsys.readouterr().err
