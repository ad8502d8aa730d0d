"""Configuration: one table of settings, parsed once into frozen objects, validated eagerly.

:data:`SETTINGS` is the single source of every setting: its option name, its
environment variable, its type, its default, whether it is a secret, and its
help. Parsing (:func:`load_config`), the CLI's connection flags and the Spark
sink's options are all derived from it, so a setting is defined in one place.

Values come from explicit arguments first, then ``TWOPHASE_*`` environment
variables. Every error names the option (the environment variable when the
value came from there). Secrets are wrapped in :class:`Secret`, which never
shows its value in ``repr``/``str``; URLs are shown with the password masked.
A secret may also be given as ``<VAR>_FILE`` naming a file that holds it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from twophase.errors import ConfigError
from twophase.store import urls

ENV_PREFIX = "TWOPHASE_"
INFLUX_APIS = ("v1", "v2", "auto")
INLINE, BACKGROUND = "inline", "background"
PROMOTIONS = (INLINE, BACKGROUND)
MAX_LANES = 32  # InfluxDB connections a writer keeps open (its pool's size)
STAGING, INFLUX = "staging", "influx"
# One promote request's worth of lines: also the staged chunk size, so that a chunk
# goes out as one request.
_REQUEST_POINTS = 5000

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


@dataclass(frozen=True)
class Setting:
    """One setting: option ``name`` (lower case), its ``TWOPHASE_*`` variable, how to read it.

    ``kind`` is ``text``, ``secret``, ``duration`` (seconds; ``30s``, ``7d``),
    ``int``, ``choice``, ``staging_url``, ``http_url`` or ``path`` (a readable
    file). ``attr`` is its field in :class:`StagingConfig` or :class:`InfluxConfig`
    (``section``). ``flag`` settings are also flags of the ``twophase`` CLI
    (``--influx-db``).
    """

    name: str
    section: str
    attr: str
    kind: str
    help: str
    default: Any = None
    required: bool = False
    flag: bool = False
    minimum: float = 0
    maximum: float | None = None
    choices: tuple[str, ...] = ()

    @property
    def env(self) -> str:
        return env_name(self.name)

    @property
    def secret(self) -> bool:
        return self.kind == "secret"

    @property
    def cli_flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def _s(name: str, attr: str, kind: str, help: str, **more: Any) -> Setting:
    return Setting(name, STAGING, attr, kind, help, **more)


def _i(name: str, attr: str, kind: str, help: str, **more: Any) -> Setting:
    return Setting(name, INFLUX, attr, kind, help, **more)


def _tls(
    section: Callable[..., Setting], prefix: str, server: str, ca_note: str
) -> tuple[Setting, ...]:
    """The CA, client certificate and key files of one server's TLS."""
    return (
        section(f"{prefix}_tls_ca", "tls_ca", "path", f"CA certificate file the certificate "
                f"of {server} must be signed by ({ca_note})"),
        section(f"{prefix}_tls_cert", "tls_cert", "path", f"client certificate file for "
                f"{server} (with {prefix}_tls_key)"),
        section(f"{prefix}_tls_key", "tls_key", "path", f"private key file of the client "
                f"certificate for {server}"),
    )  # fmt: skip


SETTINGS: tuple[Setting, ...] = (
    _s("staging_url", "url", "staging_url", "SQLAlchemy URL of the staging database "
       "(postgresql+psycopg://user@host:5432/db)", required=True, flag=True),
    _s("retention", "retention_s", "duration", "how long staged points of ended epochs are "
       "kept for resending and verifying", default=7 * 86400),
    _s("orphan_grace", "orphan_grace_s", "duration", "age after which a write of a "
       "never-decided epoch is garbage", default=3600),
    _s("staging_connect_timeout", "connect_timeout_s", "duration", "timeout of a connection "
       "to the staging database", default=10),
    _s("staging_retry_deadline", "retry_deadline_s", "duration", "how long a step (claim, "
       "decide, mark, a task's staging) retries while the staging database is unreachable "
       "before failing (retryable)", default=60.0),
    _s("staging_chunk_points", "chunk_points", "int", "lines per staged chunk (a promote "
       "request's worth)", default=_REQUEST_POINTS, minimum=1),
    _s("staging_chunk_chars", "chunk_chars", "int", "characters per staged chunk (a longer "
       "line is a chunk alone)", default=1024 * 1024, minimum=1),
    *_tls(_s, "staging", "the staging database", "libpq's sslrootcert; sslmode defaults to "
          "verify-full then"),
    _s("promote_connections", "lanes", "int", "InfluxDB connections an epoch is promoted "
       "over at once (its lanes); each series keeps to one lane, chosen when its points are "
       "staged", default=4, minimum=1, maximum=MAX_LANES),
    _i("influx_url", "url", "http_url", "http(s)://host:port of InfluxDB", required=True,
       flag=True),
    _i("influx_api", "api", "choice", "v1 (/write), v2 (/api/v2/write) or auto (asks /ping)",
       default="auto", choices=INFLUX_APIS, flag=True),
    _i("influx_db", "database", "text", "1.x database", flag=True),
    _i("influx_rp", "retention_policy", "text", "1.x retention policy", flag=True),
    _i("influx_user", "username", "text", "1.x user"),
    _i("influx_password", "password", "secret", "1.x password"),
    _i("influx_org", "org", "text", "2.x organisation", flag=True),
    _i("influx_bucket", "bucket", "text", "2.x bucket", flag=True),
    _i("influx_token", "token", "secret", "2.x token"),
    *_tls(_i, "influx", "an https InfluxDB", "default: the system's CAs"),
    _i("influx_timeout", "timeout_s", "duration", "one HTTP request's timeout", default=10.0),
    _i("influx_batch_points", "batch_points", "int", "points per promote request",
       default=_REQUEST_POINTS, minimum=1),
    _i("influx_batch_bytes", "batch_bytes", "int", "bytes per promote request",
       default=4 * 1024 * 1024, minimum=1024),
    _i("influx_retry_deadline", "retry_deadline_s", "duration", "how long promotion retries "
       "without progress before failing (retryable)", default=300.0),
    _i("influx_retry_initial", "retry_initial_s", "duration", "first backoff step",
       default=0.5),
    _i("influx_retry_max", "retry_max_s", "duration", "largest backoff step", default=30.0),
    _i("promotion", "promotion", "choice", "inline: a commit returns once its epoch is in "
       "InfluxDB; background: once it is decided, while a thread promotes it and the next "
       "batch computes (the next commit waits for it)", default=INLINE, choices=PROMOTIONS),
    _i("metrics_port", "metrics_port", "int", "port of the Prometheus endpoint of the process "
       "that promotes (the Spark driver): its InfluxDB requests; off when unset", minimum=1),
)  # fmt: skip
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
OPTIONS = tuple(BY_NAME)
SECRET_OPTIONS = tuple(s.name for s in SETTINGS if s.secret)
CLI_FLAGS = tuple(s.name for s in SETTINGS if s.flag)


def default(name: str) -> Any:
    """The table's default of a setting (for the config objects' fields)."""
    return BY_NAME[name].default


def env_name(option: str) -> str:
    """The environment variable of an option: ``influx_db`` -> ``TWOPHASE_INFLUX_DB``."""
    return ENV_PREFIX + option.upper()


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
    return urls.mask(url)


@dataclass(frozen=True)
class StagingConfig:
    """Where the PostgreSQL staging store is, and how staged data is kept.

    ``url`` is a SQLAlchemy URL (``postgresql+psycopg://user:pw@host:5432/db``);
    it may hold a password, so it is a :class:`Secret`. ``display_url`` is safe
    to print.
    """

    url: Secret
    retention_s: float = default("retention")
    orphan_grace_s: float = default("orphan_grace")
    connect_timeout_s: float = default("staging_connect_timeout")
    retry_deadline_s: float = default("staging_retry_deadline")
    chunk_points: int = default("staging_chunk_points")
    chunk_chars: int = default("staging_chunk_chars")
    lanes: int = default("promote_connections")
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    def __post_init__(self) -> None:
        _check_pair("staging_tls", self.tls_cert, self.tls_key)

    @property
    def display_url(self) -> str:
        return mask_url(self.url.reveal())

    def psycopg_conninfo(self) -> str:
        """The URL in the form psycopg accepts (no SQLAlchemy driver suffix), with the
        TLS files as libpq parameters."""
        return self._url().render(scheme="postgresql")

    def sqlalchemy_url(self) -> str:
        """The URL with the psycopg driver named (Alembic's engine)."""
        return self._url().render(scheme="postgresql+psycopg")

    def _url(self) -> urls.DbUrl:
        url = urls.DbUrl.parse(self.url.reveal())
        params = {"sslrootcert": self.tls_ca, "sslcert": self.tls_cert, "sslkey": self.tls_key}
        if self.tls_ca and "sslmode" not in url.params():
            params["sslmode"] = "verify-full"  # a CA is given to be checked, host name too
        return url.with_params({k: v for k, v in params.items() if v})


@dataclass(frozen=True)
class InfluxConfig:
    """Where and how to write to InfluxDB.

    ``api`` is ``v1`` (``/write``: database, retention policy, user/password),
    ``v2`` (``/api/v2/write`` via influxdb-client: org, bucket, token) or
    ``auto`` (resolved once through ``/ping``; see :func:`twophase.influx.api.resolve_api`).
    """

    url: str
    api: str = default("influx_api")
    database: str | None = None
    retention_policy: str | None = None
    username: str | None = None
    password: Secret | None = None
    org: str | None = None
    bucket: str | None = None
    token: Secret | None = None
    timeout_s: float = default("influx_timeout")
    batch_points: int = default("influx_batch_points")
    batch_bytes: int = default("influx_batch_bytes")
    retry_deadline_s: float = default("influx_retry_deadline")
    retry_initial_s: float = default("influx_retry_initial")
    retry_max_s: float = default("influx_retry_max")
    promotion: str = default("promotion")
    metrics_port: int | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    def __post_init__(self) -> None:
        _check_pair("influx_tls", self.tls_cert, self.tls_key)

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
        return _PARSERS[setting.kind](setting, raw, name)

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


def _text(setting: Setting, raw: Any, name: str) -> str:
    return str(raw).strip()


def _secret(setting: Setting, raw: Secret, name: str) -> Secret:
    return raw


def _duration(setting: Setting, raw: Any, name: str) -> float:
    return parse_duration(raw, name)


def _int(setting: Setting, raw: Any, name: str) -> int:
    try:
        number = int(raw)
    except (TypeError, ValueError):
        raise ConfigError(name, f"{raw!r} is not an integer") from None
    if number < setting.minimum:
        raise ConfigError(name, f"must be at least {setting.minimum}")
    if setting.maximum is not None and number > setting.maximum:
        raise ConfigError(name, f"must be at most {setting.maximum}")
    return number


def _choice(setting: Setting, raw: Any, name: str) -> str:
    value = str(raw).strip().lower()
    if value not in setting.choices:
        raise ConfigError(name, f"{value!r} is not one of {', '.join(setting.choices)}")
    return value


def _staging_url(setting: Setting, url: Secret, name: str) -> Secret:
    try:
        urls.DbUrl.parse(url.reveal()).check()
    except urls.BadUrl as exc:
        raise ConfigError(name, str(exc)) from None
    return url


def _http_url(setting: Setting, raw: Any, name: str) -> str:
    url = str(raw)
    try:
        parts = urlsplit(url)
    except ValueError:  # "Invalid IPv6 URL" (an unclosed "["; found by fuzzing)
        raise ConfigError(name, f"{mask_url(url)!r} is not an http(s) URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(name, f"{mask_url(url)!r} is not an http(s) URL")
    if parts.password:
        raise ConfigError(name, "must not hold a password; use TWOPHASE_INFLUX_PASSWORD")
    return url.rstrip("/")


def _path(setting: Setting, raw: Any, name: str) -> str:
    path = str(raw).strip()
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise ConfigError(name, f"{path!r} is not a readable file")
    return path


def _check_pair(prefix: str, cert: str | None, key: str | None) -> None:
    """A client certificate needs its key, and a key its certificate."""
    if bool(cert) != bool(key):
        missing = f"{prefix}_key" if cert else f"{prefix}_cert"
        given = f"{prefix}_cert" if cert else f"{prefix}_key"
        raise ConfigError(env_name(missing), f"is required with {env_name(given)}")


_PARSERS: dict[str, Callable[[Setting, Any, str], Any]] = {
    "text": _text,
    "secret": _secret,
    "duration": _duration,
    "int": _int,
    "choice": _choice,
    "staging_url": _staging_url,
    "http_url": _http_url,
    "path": _path,
}


def _section(section: str, env: Mapping[str, str] | None, explicit: Mapping[str, Any]) -> Any:
    src = _Source(explicit, os.environ if env is None else env)
    return {s.attr: src.value(s) for s in SETTINGS if s.section == section}


def load_setting(name: str, env: Mapping[str, str] | None = None, **explicit: Any) -> Any:
    """One setting's value, parsed (for a process that has only some of the settings:
    an executor knows the staging store, maybe not InfluxDB)."""
    return _Source(explicit, os.environ if env is None else env).value(BY_NAME[name])


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
