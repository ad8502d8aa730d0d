"""Loading settings: explicit values first, then ``TWOPHASE_*`` environment variables.

Every error names the option (the environment variable when the value came from
there). A secret may also be given as ``<VAR>_FILE`` naming a file that holds it.
Everything is parsed and validated once, when loaded.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from twophase.config.sections import InfluxConfig, StagingConfig, TwoPhaseConfig
from twophase.config.settings import BY_NAME, INFLUX, OPTIONS, SETTINGS, STAGING, Setting, env_name
from twophase.config.values import Secret, parse
from twophase.errors import ConfigError


class _Source:
    """Looks a setting up in explicit values, then the environment, and parses it."""

    def __init__(self, explicit: Mapping[str, Any], env: Mapping[str, str]) -> None:
        self._explicit = {k: v for k, v in explicit.items() if v is not None}
        self._env = env

    def get(self, option: str) -> tuple[Any, str]:
        """The raw value (None when unset) and the name it was given under."""
        if option in self._explicit:
            return self._explicit[option], option
        name = env_name(option)
        value = self._env.get(name)
        return (value if value not in ("", None) else None), name

    def value(self, setting: Setting) -> Any:
        """The parsed value, the table's default when unset; ConfigError naming it."""
        if setting.secret or setting.kind == "staging_url":
            raw, name = self._secret(setting.name)
        else:
            raw, name = self.get(setting.name)
        if raw is None:
            if setting.required:
                raise ConfigError(name, "is required but not set")
            return setting.default
        return parse(setting, raw, name)

    def _secret(self, option: str) -> tuple[Secret | None, str]:
        value, name = self.get(option)
        if value is not None:
            return (value if isinstance(value, Secret) else Secret(str(value))), name
        file_var = env_name(option) + "_FILE"
        path = self._env.get(file_var)
        if not path:
            return None, name
        try:
            with open(path, encoding="utf-8") as handle:
                return Secret(handle.read().strip()), name
        except OSError as exc:
            raise ConfigError(file_var, f"cannot read the file it names ({exc.strerror})") from None


def _source(env: Mapping[str, str] | None, explicit: Mapping[str, Any]) -> _Source:
    return _Source(explicit, os.environ if env is None else env)


def _section(
    section: str, env: Mapping[str, str] | None, explicit: Mapping[str, Any]
) -> dict[str, Any]:
    """The section's settings, parsed, by their field names."""
    src = _source(env, explicit)
    return {s.attr: src.value(s) for s in SETTINGS if s.section == section}


def load_setting(name: str, env: Mapping[str, str] | None = None, **explicit: Any) -> Any:
    """One setting's value, parsed (for a process that has only some of the settings:
    an executor knows the staging store, maybe not InfluxDB)."""
    return _source(env, explicit).value(BY_NAME[name])


def load_staging_config(env: Mapping[str, str] | None = None, **explicit: Any) -> StagingConfig:
    """The staging store settings (for processes that never talk to InfluxDB)."""
    return StagingConfig(**_section(STAGING, env, explicit))


def load_influx_config(env: Mapping[str, str] | None = None, **explicit: Any) -> InfluxConfig:
    """The InfluxDB settings; ``api`` may still be ``auto`` afterwards."""
    config = InfluxConfig(**_section(INFLUX, env, explicit))
    if config.api != "auto":
        config.validate_for_api()
    return config


def load_config(env: Mapping[str, str] | None = None, **explicit: Any) -> TwoPhaseConfig:
    """Parse and validate everything once. Keyword names are option names
    (``staging_url``, ``influx_url``, ``influx_api``, ``influx_db``, ...); each
    falls back to ``TWOPHASE_<NAME>`` in ``env`` (default: ``os.environ``)."""
    unknown = sorted(set(explicit) - set(OPTIONS))
    if unknown:
        raise ConfigError(unknown[0], f"unknown option (known: {', '.join(OPTIONS)})")
    return TwoPhaseConfig(
        staging=load_staging_config(env, **explicit),
        influx=load_influx_config(env, **explicit),
    )
