"""The optional TOML file of settings named by ``TWOPHASE_CONFIG``.

Top-level keys are option names (``staging_url = "..."``, ``min_targets = 2``);
``[targets.NAME]`` tables give a target's ``url`` and its own settings by option
name (``influx_db = "metrics"``), or by a former name of the option (an alias:
``influx_timeout`` of ``target_timeout``):

    influx_api = "v1"
    influx_db = "metrics"
    min_targets = 1

    [targets.a]
    url = "http://influx-a:8086"

    [targets.b]
    url = "https://influx-b:8086"
    influx_db = "metrics_b"

The file is checked for its shape when read (unknown keys, values that are not
strings or numbers, or booleans for a boolean setting); its values are parsed like
any other, when used. Values from the environment and explicit values win over it
([`twophase.config.loading`][twophase.config.loading]). Errors name the key and the file, never a
value.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from twophase.config.settings import ALIASES, BY_NAME, CONFIG_FILE_ENV, OPTIONS, PER_TARGET
from twophase.errors import ConfigError

URL_KEY = "url"  # a [targets.NAME] table's URL
_TARGET_KEYS = (URL_KEY, *PER_TARGET)
_TARGET_ALIASES = tuple(alias for alias, option in ALIASES.items() if option in PER_TARGET)


@dataclass(frozen=True)
class FileValues:
    """Values of the file, or of one of its ``[targets.NAME]`` tables (``prefix``
    ``targets.NAME.``), and how an error names each: ``influx_db in /etc/tp.toml``."""

    path: str = ""
    values: Mapping[str, Any] = field(default_factory=dict)
    prefix: str = ""

    def get(self, option: str) -> tuple[Any, str]:
        """The raw value (None when the file does not set it) and its name."""
        return self.values.get(option), f"{self.prefix}{option} in {self.path}"


@dataclass(frozen=True)
class ConfigFile:
    """The file's top-level settings (``targets`` as a mapping name -> URL when given
    as tables) and each target table's own settings."""

    settings: FileValues = field(default_factory=FileValues)
    tables: Mapping[str, FileValues] = field(default_factory=dict)

    def target(self, name: str) -> FileValues:
        """The settings of ``[targets.NAME]`` (none when the file has no such table)."""
        return self.tables.get(name, FileValues(self.settings.path))


NO_FILE = ConfigFile()


def read_config_file(env: Mapping[str, str]) -> ConfigFile:
    """The file ``TWOPHASE_CONFIG`` names in ``env``; [`NO_FILE`][twophase.config.files.NO_FILE]
    when it is unset."""
    path = env.get(CONFIG_FILE_ENV)
    if not path:
        return NO_FILE
    data = _load(path)
    _check_keys(path, "", data, OPTIONS, tuple(ALIASES))
    top = {k: _scalar(path, k, value, k) for k, value in data.items() if k != "targets"}
    tables: dict[str, FileValues] = {}
    if "targets" in data:
        top["targets"], tables = _targets(path, data["targets"])
    return ConfigFile(FileValues(path, top), tables)


def _load(path: str) -> dict[str, Any]:
    # Imported here: only a process given a file pays for the parser (executors too).
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(CONFIG_FILE_ENV, f"cannot read {path!r} ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        # tomllib's message says where (line, column), not what the line holds.
        raise ConfigError(CONFIG_FILE_ENV, f"{path!r} is not valid TOML: {exc}") from None


def _targets(path: str, value: Any) -> tuple[Any, dict[str, FileValues]]:
    """``targets = "a=...,b=..."`` as it is, or ``[targets.NAME]`` tables as a mapping
    name -> URL and each table's own settings."""
    if not isinstance(value, dict):
        return _scalar(path, "targets", value, "targets"), {}
    urls: dict[str, Any] = {}
    tables: dict[str, FileValues] = {}
    for name, table in value.items():
        prefix = f"targets.{name}."
        if not isinstance(table, dict):
            raise ConfigError(f"targets.{name} in {path}", "must be a table: [targets.NAME]")
        _check_keys(path, prefix, table, _TARGET_KEYS, _TARGET_ALIASES)
        own = {key: _scalar(path, prefix + key, item, key) for key, item in table.items()}
        if URL_KEY not in own:
            raise ConfigError(f"{prefix}{URL_KEY} in {path}", "is required: the target's URL")
        urls[name] = own.pop(URL_KEY)
        tables[name] = FileValues(path, own, prefix)
    return urls, tables


def _check_keys(
    path: str,
    prefix: str,
    values: Mapping[str, Any],
    known: tuple[str, ...],
    aliases: tuple[str, ...],
) -> None:
    """Refuse a key that is neither one of ``known`` nor an alias of one (the error lists
    the known names alone: aliases are for files written before)."""
    unknown = sorted(set(values) - set(known) - set(aliases))
    if unknown:
        what = "per-target setting" if prefix else "option"
        raise ConfigError(
            f"{prefix}{unknown[0]} in {path}", f"unknown {what} (known: {', '.join(known)})"
        )


def _scalar(path: str, key: str, value: Any, option: str) -> Any:
    """Settings are strings or numbers (``retention = "7d"``, ``min_targets = 2``), and
    a boolean setting also ``true`` or ``false``."""
    setting = BY_NAME.get(option)
    if isinstance(value, bool) and setting is not None and setting.kind == "bool":
        return value
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ConfigError(f"{key} in {path}", "must be a string or a number")
    return value
