"""The sink's options: parsed and validated once on the driver, shipped as plain data.

A [`SinkOptions`][twophase.spark.options.SinkOptions] is what every side of the Spark sink
works from: the driver builds it from ``.option(...)`` values (or the ``foreachBatch``
adapter's keyword arguments) and checks everything it can before a single row is computed;
executors receive it pickled inside the writer. It never holds a secret: a target's
password and token (``SECRET_OPTIONS``), and a password inside ``staging_url``, are refused
as options, because Spark logs option values and shows them in its UI. Secrets come from the
environment (``TWOPHASE_*`` or ``TWOPHASE_*_FILE``, ``PGPASSWORD``/``~/.pgpass`` for
PostgreSQL), where each process reads them itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from twophase.config import (
    BY_NAME,
    OPTIONS,
    SECRET_OPTIONS,
    StagingConfig,
    TwoPhaseConfig,
    env_name,
    load_config,
    load_setting,
    load_staging_config,
)
from twophase.config.urls import has_password
from twophase.errors import ConfigError
from twophase.model import check_sink_id
from twophase.points.builder import PointSpec

POINTS = "points"
DEAD_LETTERS = "dead_letters"
MODES = (POINTS, DEAD_LETTERS)
# Columns a dead_letters sink reads from each row.
REASON_COLUMN = "reason"
PAYLOAD_COLUMN = "payload"

POINT_OPTIONS = (
    "measurement",
    "measurement_column",
    "tags",
    "fields",
    "time",
    "precision",
    "null_fields",
)
# log_format: the data source's commit runs in a Python worker of its own, which the
# job's logging set-up never reaches; the sink configures logging there itself.
SINK_OPTIONS = ("sink_id", "mode", "dead_letter_sink", "log_format", *POINT_OPTIONS)
# Spark passes its own writeStream options to every sink; they are not ours to judge.
SPARK_OPTIONS = ("checkpointlocation", "path", "queryname")
MAX_SINK_ID_LENGTH = 200


@dataclass(frozen=True)
class SinkOptions:
    """One sink's settings. Picklable, immutable, free of secrets.

    ``spec`` is set in ``points`` mode (rows become points) and None
    in ``dead_letters`` mode (every row, with its ``reason`` and ``payload``
    columns, goes to the dead-letter table; nothing reaches a target).
    ``settings`` are the explicitly given ``TWOPHASE_*`` options (lower-case
    names); everything else falls back to the environment of the process
    that reads it.
    """

    sink_id: str
    mode: str
    spec: PointSpec | None
    settings: tuple[tuple[str, str], ...] = ()
    dead_letter_sink: str | None = None
    log_format: str | None = None

    def dead_letters(self) -> SinkOptions:
        """The sink that rows split off upstream go to (``dead_letter_sink``), with the
        same settings; ConfigError when none was configured."""
        if self.dead_letter_sink is None:
            raise ConfigError(
                "dead_letter_sink",
                f"is not set for sink {self.sink_id!r}: set it to split dead letters off",
            )
        return SinkOptions(
            self.dead_letter_sink, DEAD_LETTERS, None, self.settings, log_format=self.log_format
        )

    def staging_config(self) -> StagingConfig:
        """The staging store settings (all an executor needs)."""
        return load_staging_config(None, **dict(self.settings))

    def config(self) -> TwoPhaseConfig:
        """The full configuration (the driver's commit needs the targets' too)."""
        return load_config(None, **dict(self.settings))

    def writes_unsigned(self) -> bool:
        """Whether unsigned integers can be written: only through the 2.x or 3 API, named
        explicitly (read alone: executors may lack the other InfluxDB settings)."""
        return load_setting("influx_api", None, **dict(self.settings)) in ("v2", "v3")

    def allows_newlines(self) -> bool:
        """Whether a string field value may hold a raw line feed or carriage return
        (``allow_newlines_in_strings``; read alone, as ``writes_unsigned`` reads its
        setting)."""
        return bool(load_setting("allow_newlines_in_strings", None, **dict(self.settings)))


def parse_options(options: Mapping[str, str]) -> SinkOptions:
    """Build and validate a sink from ``.option(...)`` strings (keys in any case).

    ``tags`` and ``fields`` are comma-separated column names. Raises
    [`ConfigError`][twophase.errors.ConfigError] naming the offending option: unknown option, secret
    given as an option, missing ``sink_id``, neither or both of ``measurement`` and
    ``measurement_column``, bad spec, or a setting (from options or the environment) that
    does not validate.
    """
    values = {key.lower(): str(value) for key, value in options.items()}
    for key in values:
        if key not in SINK_OPTIONS and key not in BY_NAME and key not in SPARK_OPTIONS:
            raise ConfigError(key, _unknown_hint())
    spec_values = {key: values[key] for key in POINT_OPTIONS if key in values}
    mode = values.get("mode", POINTS).strip().lower()
    spec = None
    if mode == POINTS:
        spec = PointSpec(
            measurement=values.get("measurement", ""),
            tag_columns=_columns(values.get("tags")) or (),
            field_columns=_columns(values.get("fields")),
            time_column=values.get("time", "").strip() or None,
            precision=values.get("precision", "ns").strip().lower(),
            null_fields=values.get("null_fields", "reject").strip().lower(),
            measurement_column=_column(values.get("measurement_column")),
        )
    settings = {key: value for key, value in values.items() if key in BY_NAME}
    sink_id, dead = values.get("sink_id", ""), values.get("dead_letter_sink")
    sink = build_sink(sink_id, mode, spec, settings, spec_values, dead)
    return replace(sink, log_format=_log_format(values.get("log_format")))


def build_sink(
    sink_id: str,
    mode: str,
    spec: PointSpec | None,
    settings: Mapping[str, Any],
    given_point_options: Iterable[str] = (),
    dead_letter_sink: str | None = None,
) -> SinkOptions:
    """Validate the parts of a sink and assemble it; see
    [`parse_options`][twophase.spark.options.parse_options].

    Loads the full configuration once (environment included), so a missing
    ``TWOPHASE_STAGING_URL`` or a bad duration fails here, on the driver,
    before the query computes anything.
    """
    sink_id = _check_sink_id(sink_id)
    if mode not in MODES:
        raise ConfigError("mode", f"{mode!r} is not one of {', '.join(MODES)}")
    if mode == DEAD_LETTERS:
        extra = sorted(given_point_options)
        if extra:
            raise ConfigError(
                extra[0],
                "only applies to mode=points (a dead_letters sink writes nothing to a target)",
            )
        spec = None
    else:
        if spec is None:
            raise ConfigError("measurement", "is required (mode=points)")
        if not spec.measurement and spec.measurement_column is None:
            raise ConfigError(
                "measurement",
                "is required: the measurement to write (or measurement_column, "
                "the column that holds each row's)",
            )
        spec.validate()  # refuses both measurement and measurement_column, naming the latter
    clean = _check_settings(settings)
    dead = _check_dead_letter_sink(sink_id, mode, dead_letter_sink)
    sink = SinkOptions(sink_id, mode, spec, tuple(sorted(clean.items())), dead)
    sink.config()  # fail fast: every setting, from options or environment, must validate
    sink.allows_newlines()  # read by the point builder alone: not part of the config
    return sink


def check_schema(sink: SinkOptions, columns: Iterable[str]) -> None:
    """Refuse a query whose output lacks a column the sink was told to read.

    Raises [`ConfigError`][twophase.errors.ConfigError] naming the option that names the column.
    """
    present = set(columns)
    for option, column in _needed_columns(sink):
        if column not in present:
            raise ConfigError(
                option,
                f"column {column!r} is not in the query's output "
                f"(columns: {', '.join(sorted(present)) or 'none'})",
            )
    if sink.spec is not None and sink.spec.field_columns is None:
        others = present - sink.spec.not_fields()
        if not others:
            raise ConfigError("fields", "the query's output has no column left for fields")


def _needed_columns(sink: SinkOptions) -> list[tuple[str, str]]:
    if sink.spec is None:
        return [("mode", REASON_COLUMN), ("mode", PAYLOAD_COLUMN)]
    needed = [("tags", column) for column in sink.spec.tag_columns]
    needed += [("fields", column) for column in sink.spec.field_columns or ()]
    if sink.spec.time_column is not None:
        needed.append(("time", sink.spec.time_column))
    if sink.spec.measurement_column is not None:
        needed.append(("measurement_column", sink.spec.measurement_column))
    return needed


def _log_format(text: str | None) -> str | None:
    if text is None:
        return None
    from twophase import logs  # not at the top: executors unpickle options, never log set-up

    fmt = text.strip().lower()
    if fmt not in logs.FORMATS:
        raise ConfigError(logs.OPTION, f"{text!r} is not one of {', '.join(logs.FORMATS)}")
    return fmt


def _column(text: str | None) -> str | None:
    """One column name, stripped; None when the option was not given (given empty, it
    is refused by the spec's check)."""
    return None if text is None else text.strip()


def _columns(text: str | None) -> tuple[str, ...] | None:
    """``"a, b"`` -> ``("a", "b")``; None when the option was not given."""
    if text is None:
        return None
    return tuple(part.strip() for part in text.split(",")) if text.strip() else ()


def _check_sink_id(sink_id: str, option: str = "sink_id") -> str:
    if not isinstance(sink_id, str) or not sink_id.strip():
        raise ConfigError(
            option,
            "is required: a stable name for this output, unique per "
            "query (like Kafka's transactional.id)",
        )
    if sink_id != sink_id.strip() or len(sink_id) > MAX_SINK_ID_LENGTH:
        raise ConfigError(
            option,
            f"must have no surrounding spaces and at most {MAX_SINK_ID_LENGTH} characters",
        )
    return check_sink_id(sink_id, option)


def _check_dead_letter_sink(sink_id: str, mode: str, dead: str | None) -> str | None:
    if dead is None:
        return None
    if mode != POINTS:
        raise ConfigError("dead_letter_sink", "only applies to mode=points")
    _check_sink_id(dead, "dead_letter_sink")
    if dead == sink_id:
        raise ConfigError("dead_letter_sink", f"must differ from sink_id {sink_id!r}")
    return dead


def _check_settings(settings: Mapping[str, Any]) -> dict[str, str]:
    clean: dict[str, str] = {}
    for key, value in settings.items():
        name = key.lower()
        if name in BY_NAME and BY_NAME[name].secret:  # an alias of a secret too
            raise ConfigError(
                name,
                f"is a secret and cannot be a Spark option (Spark logs "
                f"options and shows them in its UI): set {env_name(name)} or "
                f"{env_name(name)}_FILE in the environment instead",
            )
        if name not in BY_NAME:  # an option or an alias (influx_url of target_url)
            raise ConfigError(name, _unknown_hint())
        if value is None:
            continue
        if name == "staging_url":
            _refuse_password(str(value))
        clean[name] = str(value)
    return clean


def _refuse_password(url: str) -> None:
    if has_password(url):  # a malformed URL is reported by load_config
        raise ConfigError(
            "staging_url",
            "must not contain a password as a Spark option (Spark logs options), neither "
            "user:password@ nor a ?password= or ?sslpassword= parameter: put the URL in "
            "TWOPHASE_STAGING_URL, or the password in PGPASSWORD or ~/.pgpass",
        )


def _unknown_hint() -> str:
    known = ", ".join((*SINK_OPTIONS, *(o for o in OPTIONS if o not in SECRET_OPTIONS)))
    return f"unknown option of the twophase sink (known: {known})"
