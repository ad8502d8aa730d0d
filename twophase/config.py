"""Configuration: one frozen object, parsed once, validated eagerly.

Values come from explicit arguments first, then ``TWOPHASE_*`` environment
variables. Every error names the option (the environment variable when the
value came from there). Secrets are wrapped in :class:`Secret`, which never
shows its value in ``repr``/``str``; URLs are shown with the password masked.
A secret may also be given as ``<VAR>_FILE`` naming a file that holds it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from twophase.errors import ConfigError

ENV_PREFIX = "TWOPHASE_"
INFLUX_APIS = ("v1", "v2", "auto")
OPTIONS = (
    "staging_url",
    "retention",
    "orphan_grace",
    "staging_connect_timeout",
    "influx_url",
    "influx_api",
    "influx_db",
    "influx_rp",
    "influx_user",
    "influx_password",
    "influx_org",
    "influx_bucket",
    "influx_token",
    "influx_timeout",
    "influx_batch_points",
    "influx_batch_bytes",
    "influx_retry_deadline",
    "influx_retry_initial",
    "influx_retry_max",
)
SECRET_OPTIONS = ("influx_password", "influx_token")

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


@dataclass(frozen=True)
class Secret:
    """A value that must never be printed: ``repr`` and ``str`` mask it."""

    _value: str = field(repr=False)

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__


def parse_duration(text: str | float | int, option: str) -> float:
    """``'7d'``, ``'12h'``, ``'30m'``, ``'45s'``, ``'500ms'`` or a number of seconds."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        seconds = float(text)
    else:
        match = _DURATION.match(str(text))
        if not match:
            raise ConfigError(option, f"{text!r} is not a duration (examples: 500ms, 45s, 30m, 7d)")
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2) or "s"]
    if seconds < 0:
        raise ConfigError(option, "must not be negative")
    return seconds


def mask_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (for logs and errors)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return re.sub(r"//([^:/@]*):[^@]*@", r"//\1:***@", url)


@dataclass(frozen=True)
class StagingConfig:
    """Where the PostgreSQL staging store is.

    ``url`` is a SQLAlchemy URL (``postgresql+psycopg://user:pw@host:5432/db``);
    it may hold a password, so it is a :class:`Secret`. ``display_url`` is safe
    to print.
    """

    url: Secret
    retention_s: float = 7 * 86400
    orphan_grace_s: float = 3600
    connect_timeout_s: float = 10

    @property
    def display_url(self) -> str:
        return mask_url(self.url.reveal())

    def psycopg_conninfo(self) -> str:
        """The URL in the form psycopg accepts (no SQLAlchemy driver suffix)."""
        return (
            make_url(self.url.reveal())
            .set(drivername="postgresql")
            .render_as_string(hide_password=False)
        )

    def sqlalchemy_url(self) -> str:
        url = make_url(self.url.reveal())
        if url.drivername == "postgresql":
            url = url.set(drivername="postgresql+psycopg")
        return url.render_as_string(hide_password=False)


@dataclass(frozen=True)
class InfluxConfig:
    """Where and how to write to InfluxDB.

    ``api`` is ``v1`` (``/write``: database, retention policy, user/password),
    ``v2`` (``/api/v2/write`` via influxdb-client: org, bucket, token) or
    ``auto`` (resolved once through ``/ping``; see :func:`twophase.influx.resolve_api`).
    """

    url: str
    api: str = "auto"
    database: str | None = None
    retention_policy: str | None = None
    username: str | None = None
    password: Secret | None = None
    org: str | None = None
    bucket: str | None = None
    token: Secret | None = None
    timeout_s: float = 10.0
    batch_points: int = 5000
    batch_bytes: int = 4 * 1024 * 1024
    retry_deadline_s: float = 300.0
    retry_initial_s: float = 0.5
    retry_max_s: float = 30.0

    def validate_for_api(self) -> None:
        """Check the settings the chosen API needs (after ``auto`` is resolved)."""
        if self.api == "v1" and not self.database:
            raise ConfigError(env_name("influx_db"), "required with the InfluxDB 1.x API")
        if self.api == "v2":
            if not self.bucket:
                raise ConfigError(env_name("influx_bucket"), "required with the InfluxDB 2.x API")
            if not self.org:
                raise ConfigError(env_name("influx_org"), "required with the InfluxDB 2.x API")


@dataclass(frozen=True)
class TwoPhaseConfig:
    """Everything a process of twophase needs: the staging store and InfluxDB."""

    staging: StagingConfig
    influx: InfluxConfig


def env_name(option: str) -> str:
    """The environment variable of an option: ``influx_db`` -> ``TWOPHASE_INFLUX_DB``."""
    return ENV_PREFIX + option.upper()


class _Source:
    """Looks an option up in explicit values, then the environment; remembers the name used."""

    def __init__(self, explicit: Mapping[str, Any], env: Mapping[str, str]) -> None:
        self._explicit = {k: v for k, v in explicit.items() if v is not None}
        self._env = env

    def get(self, option: str) -> tuple[Any, str]:
        if option in self._explicit:
            return self._explicit[option], option
        name = env_name(option)
        value = self._env.get(name)
        return (value if value not in ("", None) else None), name

    def text(self, option: str, required: bool = False) -> str | None:
        value, name = self.get(option)
        if value is None:
            if required:
                raise ConfigError(name, "is required but not set")
            return None
        return str(value).strip()

    def secret(self, option: str) -> Secret | None:
        value, name = self.get(option)
        if isinstance(value, Secret):
            return value
        if value is not None:
            return Secret(str(value))
        file_var = name + "_FILE" if name.startswith(ENV_PREFIX) else env_name(option) + "_FILE"
        path = self._env.get(file_var)
        if not path:
            return None
        try:
            with open(path, encoding="utf-8") as handle:
                return Secret(handle.read().strip())
        except OSError as exc:
            raise ConfigError(file_var, f"cannot read the file it names ({exc.strerror})") from None

    def number(self, option: str, default: float, kind: type = float, minimum: float = 0) -> Any:
        value, name = self.get(option)
        if value is None:
            return kind(default)
        try:
            number = kind(value)
        except (TypeError, ValueError):
            raise ConfigError(name, f"{value!r} is not a {kind.__name__}") from None
        if number < minimum:
            raise ConfigError(name, f"must be at least {minimum}")
        return number

    def duration(self, option: str, default: float) -> float:
        value, name = self.get(option)
        return default if value is None else parse_duration(value, name)


def _check_staging_url(url: Secret, option: str) -> None:
    try:
        parsed = make_url(url.reveal())
    except (ArgumentError, ValueError):
        raise ConfigError(
            option, "is not a database URL (postgresql+psycopg://user@host/db)"
        ) from None
    if not parsed.drivername.startswith("postgresql"):
        raise ConfigError(option, f"must be a PostgreSQL URL, not {parsed.drivername!r}")
    if parsed.drivername not in ("postgresql", "postgresql+psycopg"):
        raise ConfigError(option, "use the psycopg driver: postgresql+psycopg://...")


def _check_http_url(url: str, option: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(option, f"{mask_url(url)!r} is not an http(s) URL")
    if parts.password:
        raise ConfigError(option, "must not hold a password; use TWOPHASE_INFLUX_PASSWORD")
    return url.rstrip("/")


def load_staging_config(env: Mapping[str, str] | None = None, **explicit: Any) -> StagingConfig:
    """The staging store settings (for processes that never talk to InfluxDB)."""
    src = _Source(explicit, os.environ if env is None else env)
    url = src.secret("staging_url")
    if url is None:
        raise ConfigError(env_name("staging_url"), "is required but not set")
    _check_staging_url(url, src.get("staging_url")[1])
    return StagingConfig(
        url=url,
        retention_s=src.duration("retention", 7 * 86400),
        orphan_grace_s=src.duration("orphan_grace", 3600),
        connect_timeout_s=src.duration("staging_connect_timeout", 10),
    )


def load_influx_config(env: Mapping[str, str] | None = None, **explicit: Any) -> InfluxConfig:
    """The InfluxDB settings; ``api`` may still be ``auto`` afterwards."""
    src = _Source(explicit, os.environ if env is None else env)
    url_value, url_name = src.get("influx_url")
    if url_value is None:
        raise ConfigError(url_name, "is required but not set")
    api = (src.text("influx_api") or "auto").lower()
    if api not in INFLUX_APIS:
        raise ConfigError(
            src.get("influx_api")[1], f"{api!r} is not one of {', '.join(INFLUX_APIS)}"
        )
    config = InfluxConfig(
        url=_check_http_url(str(url_value), url_name),
        api=api,
        database=src.text("influx_db"),
        retention_policy=src.text("influx_rp"),
        username=src.text("influx_user"),
        password=src.secret("influx_password"),
        org=src.text("influx_org"),
        bucket=src.text("influx_bucket"),
        token=src.secret("influx_token"),
        timeout_s=src.duration("influx_timeout", 10.0),
        batch_points=src.number("influx_batch_points", 5000, int, minimum=1),
        batch_bytes=src.number("influx_batch_bytes", 4 * 1024 * 1024, int, minimum=1024),
        retry_deadline_s=src.duration("influx_retry_deadline", 300.0),
        retry_initial_s=src.duration("influx_retry_initial", 0.5),
        retry_max_s=src.duration("influx_retry_max", 30.0),
    )
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
