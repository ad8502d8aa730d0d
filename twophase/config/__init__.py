"""Configuration: one table of settings, parsed once into frozen objects, validated eagerly.

The package is read in this order:

- [`twophase.config.settings`][twophase.config.settings]:
  [`SETTINGS`][twophase.config.settings.SETTINGS], the single source of every setting (option
  name, environment variable, kind, default, secret, help), and what is derived
  from it ([`BY_NAME`][twophase.config.settings.BY_NAME],
  [`OPTIONS`][twophase.config.settings.OPTIONS], [`CLI_FLAGS`][twophase.config.settings.CLI_FLAGS],
  [`ALIASES`][twophase.config.settings.ALIASES], [`env_name`][twophase.config.settings.env_name]);
- [`twophase.config.values`][twophase.config.values]: reading one value of each kind
  ([`parse_duration`][twophase.config.values.parse_duration],
  [`Secret`][twophase.config.values.Secret], URLs, paths);
- [`twophase.config.sections`][twophase.config.sections]: the frozen
  [`StagingConfig`][twophase.config.sections.StagingConfig],
  [`TargetConfig`][twophase.config.sections.TargetConfig] (with its sections only one
  kind reads, [`InfluxDBSettings`][twophase.config.sections.InfluxDBSettings] and
  [`PostgreSQLSettings`][twophase.config.sections.PostgreSQLSettings], and its
  [`NamedTarget`][twophase.config.sections.NamedTarget]s) and
  [`TwoPhaseConfig`][twophase.config.sections.TwoPhaseConfig];
- [`twophase.config.files`][twophase.config.files]: the optional TOML file ``TWOPHASE_CONFIG``
  names;
- [`twophase.config.loading`][twophase.config.loading]:
  [`load_config`][twophase.config.loading.load_config] and its parts, explicit values first, then
  ``TWOPHASE_*`` environment variables (or ``<VAR>_FILE`` for a secret), then the
  file; one target's overrides are ``TWOPHASE_TARGET_<NAME>_<OPTION>``;
- [`twophase.config.urls`][twophase.config.urls]: PostgreSQL URLs checked and masked without
  SQLAlchemy (executors read them);
- [`twophase.config.sslmode`][twophase.config.sslmode]: the staging store's ``sslmode`` when its
  URL chooses none (verified TLS to a host that is not loopback);
- [`twophase.config.tls`][twophase.config.tls]: TLS failures as errors naming the setting to fix;
- [`twophase.config.former`][twophase.config.former]: the names of a former version
  (``InfluxConfig``, ``load_influx_config``), which warn when used.

Every error names the option (the environment variable when the value came from
there). Secrets never show their value in ``repr``/``str``; URLs are shown with the
password masked.
"""

from __future__ import annotations

from typing import Any

from twophase.config.loading import (
    load_config,
    load_exporter_config,
    load_setting,
    load_staging_config,
    load_target_config,
)
from twophase.config.sections import (
    DEFAULT_TARGET,
    EndpointConfig,
    ExporterConfig,
    InfluxDBSettings,
    NamedTarget,
    PostgreSQLSettings,
    StagingConfig,
    TargetConfig,
    TwoPhaseConfig,
)
from twophase.config.settings import (
    ALIASES,
    BACKGROUND,
    BY_NAME,
    CLI_ALIASES,
    CLI_FLAGS,
    COMPRESSIONS,
    CONFIG_FILE_ENV,
    ENV_PREFIX,
    EXPORTER,
    GZIP,
    INFLUX_APIS,
    INFLUXDB,
    INLINE,
    MAX_LANES,
    OPTIONS,
    PER_TARGET,
    POSTGRESQL,
    PROMOTIONS,
    SECRET_OPTIONS,
    SETTINGS,
    STAGING,
    TARGET,
    TARGET_SECTIONS,
    UNCOMPRESSED,
    Setting,
    default,
    env_name,
    target_env_name,
)
from twophase.config.values import Secret, mask_url, parse_duration

__all__ = [
    "ALIASES",
    "BACKGROUND",
    "BY_NAME",
    "CLI_ALIASES",
    "CLI_FLAGS",
    "COMPRESSIONS",
    "CONFIG_FILE_ENV",
    "DEFAULT_TARGET",
    "ENV_PREFIX",
    "EXPORTER",
    "GZIP",
    "INFLUXDB",
    "INFLUX_APIS",
    "INLINE",
    "MAX_LANES",
    "OPTIONS",
    "PER_TARGET",
    "POSTGRESQL",
    "PROMOTIONS",
    "SECRET_OPTIONS",
    "SETTINGS",
    "STAGING",
    "TARGET",
    "TARGET_SECTIONS",
    "UNCOMPRESSED",
    "EndpointConfig",
    "ExporterConfig",
    "InfluxDBSettings",
    "NamedTarget",
    "PostgreSQLSettings",
    "Secret",
    "Setting",
    "StagingConfig",
    "TargetConfig",
    "TwoPhaseConfig",
    "default",
    "env_name",
    "load_config",
    "load_exporter_config",
    "load_setting",
    "load_staging_config",
    "load_target_config",
    "mask_url",
    "parse_duration",
    "target_env_name",
]


def __getattr__(name: str) -> Any:
    """The names of a former version (``InfluxConfig``), with a DeprecationWarning."""
    from twophase.config.former import former_name

    return former_name(__name__, name, stacklevel=2)
