"""Configuration: one table of settings, parsed once into frozen objects, validated eagerly.

The package is read in this order:

- :mod:`.settings`: :data:`SETTINGS`, the single source of every setting (option
  name, environment variable, kind, default, secret, help), and what is derived
  from it (:data:`BY_NAME`, :data:`OPTIONS`, :data:`CLI_FLAGS`, :func:`env_name`);
- :mod:`.values`: reading one value of each kind (:func:`parse_duration`,
  :class:`Secret`, URLs, paths);
- :mod:`.sections`: the frozen :class:`StagingConfig`, :class:`InfluxConfig` (with
  its named :class:`TargetConfig` servers) and :class:`TwoPhaseConfig`;
- :mod:`.files`: the optional TOML file ``TWOPHASE_CONFIG`` names;
- :mod:`.loading`: :func:`load_config` and its parts, explicit values first, then
  ``TWOPHASE_*`` environment variables (or ``<VAR>_FILE`` for a secret), then the
  file; one target's overrides are ``TWOPHASE_TARGET_<NAME>_<OPTION>``;
- :mod:`.urls`: PostgreSQL URLs checked and masked without SQLAlchemy (executors read them);
- :mod:`.tls`: TLS failures as errors naming the setting to fix.

Every error names the option (the environment variable when the value came from
there). Secrets never show their value in ``repr``/``str``; URLs are shown with the
password masked.
"""

from __future__ import annotations

from twophase.config.loading import (
    load_config,
    load_influx_config,
    load_setting,
    load_staging_config,
)
from twophase.config.sections import (
    DEFAULT_TARGET,
    InfluxConfig,
    StagingConfig,
    TargetConfig,
    TwoPhaseConfig,
)
from twophase.config.settings import (
    BACKGROUND,
    BY_NAME,
    CLI_FLAGS,
    COMPRESSIONS,
    CONFIG_FILE_ENV,
    ENV_PREFIX,
    GZIP,
    INFLUX,
    INFLUX_APIS,
    INLINE,
    MAX_LANES,
    OPTIONS,
    PER_TARGET,
    PROMOTIONS,
    SECRET_OPTIONS,
    SETTINGS,
    STAGING,
    UNCOMPRESSED,
    Setting,
    default,
    env_name,
    target_env_name,
)
from twophase.config.values import Secret, mask_url, parse_duration

__all__ = [
    "BACKGROUND",
    "BY_NAME",
    "CLI_FLAGS",
    "COMPRESSIONS",
    "CONFIG_FILE_ENV",
    "DEFAULT_TARGET",
    "ENV_PREFIX",
    "GZIP",
    "INFLUX",
    "INFLUX_APIS",
    "INLINE",
    "MAX_LANES",
    "OPTIONS",
    "PER_TARGET",
    "PROMOTIONS",
    "SECRET_OPTIONS",
    "SETTINGS",
    "STAGING",
    "UNCOMPRESSED",
    "InfluxConfig",
    "Secret",
    "Setting",
    "StagingConfig",
    "TargetConfig",
    "TwoPhaseConfig",
    "default",
    "env_name",
    "load_config",
    "load_influx_config",
    "load_setting",
    "load_staging_config",
    "mask_url",
    "parse_duration",
    "target_env_name",
]
