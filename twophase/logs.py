"""Log lines for twophase's own entry points: the spark-submit jobs and the ``twophase`` command.

The library configures nothing: ``import twophase`` gives the ``twophase``
logger a ``NullHandler`` and leaves the rest to the application. An entry
point calls [`configure`][twophase.logs.configure] once; it attaches one handler to the
``twophase`` logger only, so Spark's, py4j's and the application's own
logging stay as they are.

Two forms (``--log-format``):

* ``text``: ``<UTC time> <LEVEL> <logger>: <message> [sink=S epoch=N run=R]``;
* ``json``: one object per line, keys ``time``, ``level``, ``logger``,
  ``message`` and the context fields at the top level (python-json-logger,
  the extra ``twophase[json-logs]``).

A protocol log line names the sink, epoch and run it is about when they are
known: the call passes ``extra=fields(...)`` (or [`lease_fields`][twophase.logs.lease_fields]), and
both forms show ``sink_id``, ``epoch`` and ``run_id``. Messages never hold
secrets: URLs are masked before they reach a message.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TextIO

from twophase.errors import ConfigError
from twophase.wording import epoch_label, iso

if TYPE_CHECKING:
    from twophase.model import Lease

TEXT, JSON = "text", "json"
FORMATS = (TEXT, JSON)
OPTION = "log_format"
# The context of a protocol log line: record attribute -> its name in the text form.
CONTEXT = {"sink_id": "sink", "epoch": "epoch", "run_id": "run"}
_ROOT = "twophase"
# The name of the handler configure() attaches: a second call replaces it (no doubled lines).
_HANDLER = "twophase.logs"


def fields(
    sink_id: str | None = None, epoch: int | None = None, run_id: str | None = None
) -> dict[str, Any]:
    """The ``extra=`` of a log line about a sink, an epoch or a run: the values known."""
    known = {"sink_id": sink_id, "epoch": epoch, "run_id": run_id}
    return {key: value for key, value in known.items() if value is not None}


def lease_fields(lease: Lease, epoch: int | None = None) -> dict[str, Any]:
    """[`fields`][twophase.logs.fields] of a run's lease on a sink, and of one of its epochs."""
    return fields(lease.sink_id, epoch, lease.run_id)


class TextFormatter(logging.Formatter):
    """One readable line: UTC time, level, logger, message, then the context in brackets."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        # UTC, as the CLI and the staging store show times: lines of several hosts compare.
        return iso(datetime.fromtimestamp(record.created, timezone.utc))

    def formatMessage(self, record: logging.LogRecord) -> str:
        # formatMessage, not format: the context stays on the message's line, before
        # any traceback that format() appends.
        context = _text_context(record)
        line = super().formatMessage(record)
        return f"{line} [{context}]" if context else line


def _text_context(record: logging.LogRecord) -> str:
    """``sink=dash epoch=3 run=...`` from a record's context fields (corrections as ``cN``)."""
    shown = []
    for key, word in CONTEXT.items():
        value = getattr(record, key, None)
        if value is None:
            continue
        if key == "epoch" and isinstance(value, int):
            value = epoch_label(value)
        shown.append(f"{word}={value}")
    return " ".join(shown)


def formatter(fmt: str) -> logging.Formatter:
    """The formatter of ``fmt`` (``text`` or ``json``); ConfigError naming ``log_format``
    for another name, or for ``json`` without python-json-logger."""
    if fmt == TEXT:
        return TextFormatter()
    if fmt == JSON:
        return _json_formatter()
    raise ConfigError(OPTION, f"{fmt!r} is not a log format (one of {', '.join(FORMATS)})")


def _json_formatter() -> logging.Formatter:
    # Imported here: the package is an optional extra, and text logs do not need it.
    try:
        from pythonjsonlogger.json import JsonFormatter
    except ImportError:
        raise ConfigError(
            OPTION,
            "JSON log lines need python-json-logger: install twophase[json-logs]",
        ) from None
    # Every other attribute a call passes in extra= (sink_id, epoch, run_id) becomes a
    # top-level key of its own.
    return JsonFormatter(
        "%(levelname)s %(name)s %(message)s",
        rename_fields={"levelname": "level", "name": "logger"},
        timestamp="time",
        json_default=_json_value,
    )


def _json_value(value: object) -> str:
    """What ``json`` cannot encode: the time as the CLI's JSON writes times, the rest as text."""
    return iso(value) if isinstance(value, datetime) else str(value)


def configure(fmt: str = TEXT, level: int = logging.INFO, stream: TextIO | None = None) -> None:
    """Send twophase's log lines at ``level`` and above to ``stream`` (default: stderr)
    in form ``fmt``. Idempotent: a second call replaces the first one's handler.

    Raises ConfigError (option ``log_format``) for an unknown form, or for ``json``
    when python-json-logger is not installed.
    """
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter(fmt))
    handler.set_name(_HANDLER)
    logger = logging.getLogger(_ROOT)
    for old in [h for h in logger.handlers if h.get_name() == _HANDLER]:
        logger.removeHandler(old)
    logger.addHandler(handler)
    logger.setLevel(level)
