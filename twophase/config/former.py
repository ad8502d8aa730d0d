"""The configuration's names of a former version, each built from today's: reached
through ``twophase.config`` (and ``twophase``), they warn when used."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twophase.config.loading import load_target_config
from twophase.config.sections import TargetConfig
from twophase.deprecation import warn_deprecated


def influx_config(url: str, **given: Any) -> TargetConfig:
    """``InfluxConfig(...)``: its flat fields sorted into a TargetConfig's sections."""
    return TargetConfig(url=url).with_fields(**given)


def load_influx_config(env: Mapping[str, str] | None = None, **explicit: Any) -> TargetConfig:
    """``load_influx_config(...)``: `load_target_config`."""
    return load_target_config(env, **explicit)


# Former name -> (what replaced it, as the warning names it; the object served).
FORMER: dict[str, tuple[str, Any]] = {
    "InfluxConfig": ("TargetConfig (InfluxDB's settings in its influxdb section)", influx_config),
    "load_influx_config": ("load_target_config", load_influx_config),
}


def former_name(module: str, name: str, stacklevel: int) -> Any:
    """A former name's object, after its DeprecationWarning; AttributeError for any other
    name. ``stacklevel`` is counted as ``warnings.warn`` counts it where this is called."""
    if name not in FORMER:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    new, served = FORMER[name]
    warn_deprecated(f"{module}.{name}", new, stacklevel=stacklevel + 1)
    return served
