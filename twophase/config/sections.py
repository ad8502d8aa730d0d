"""The frozen configurations: the staging store's, InfluxDB's, and both together.

Their fields are the table's settings of their section (``Setting.attr``), with
the table's defaults. A client certificate without its key, or a key without its
certificate, is refused when the object is made. A sink delivers to one or more
named InfluxDB targets ([`TargetConfig`][twophase.config.sections.TargetConfig]), each with an
[`InfluxConfig`][twophase.config.sections.InfluxConfig]
of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from twophase.config import urls
from twophase.config.settings import default, env_name
from twophase.config.values import Secret, mask_url
from twophase.errors import ConfigError


@dataclass(frozen=True)
class StagingConfig:
    """Where the PostgreSQL staging store is, and how staged data is kept.

    ``url`` is a SQLAlchemy URL (``postgresql+psycopg://user:pw@host:5432/db``);
    it may hold a password, so it is a [`Secret`][twophase.config.values.Secret].
    ``display_url`` is safe to print.
    """

    url: Secret
    retention_s: float = default("retention")
    orphan_grace_s: float = default("orphan_grace")
    gc_interval_s: float = default("gc_interval")
    connect_timeout_s: float = default("staging_connect_timeout")
    retry_deadline_s: float = default("staging_retry_deadline")
    chunk_points: int = default("staging_chunk_points")
    chunk_chars: int = default("staging_chunk_chars")
    spool_memory: int = default("staging_spool_memory")
    lanes: int = default("promote_connections")
    compression: str = default("compression")
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
    ``v2`` (``/api/v2/write`` via influxdb-client: org, bucket, token), ``v3``
    (InfluxDB 3's ``/api/v3/write_lp``: database, token) or ``auto`` (resolved
    once through ``/ping``, never to ``v3``; see
    [`twophase.influx.api.resolve_api`][twophase.influx.api.resolve_api]).

    ``targets`` are the named servers of a sink with several (the ``targets``
    setting); empty when ``influx_url`` names the one server. With targets,
    ``url`` is the first target's, so code that talks to one server keeps
    working, and the other fields are the settings the targets share; each
    target's own (overrides applied) is in its
    [`TargetConfig`][twophase.config.sections.TargetConfig].
    `named_targets` gives the targets either way.
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
    allow_plaintext_credentials: bool = default("allow_plaintext_credentials")
    targets: tuple[TargetConfig, ...] = ()
    min_targets: int = default("min_targets")
    target_deadline_s: float = default("target_deadline")
    target_max_lag_s: float = default("target_max_lag")

    def __post_init__(self) -> None:
        _check_pair("influx_tls", self.tls_cert, self.tls_key)

    def named_targets(self) -> tuple[TargetConfig, ...]:
        """The targets, or the one (named
        [`DEFAULT_TARGET`][twophase.config.sections.DEFAULT_TARGET]) that ``influx_url`` makes."""
        return self.targets or (TargetConfig(DEFAULT_TARGET, self),)

    def validate_for_api(self) -> None:
        """Check the settings the chosen API needs (after ``auto`` is resolved)."""
        if self.api in ("v1", "v3") and not self.database:
            version = "1.x" if self.api == "v1" else "3"
            raise ConfigError(env_name("influx_db"), f"required with the InfluxDB {version} API")
        if self.api == "v2":
            if not self.bucket:
                raise ConfigError(env_name("influx_bucket"), "required with the InfluxDB 2.x API")
            if not self.org:
                raise ConfigError(env_name("influx_org"), "required with the InfluxDB 2.x API")


DEFAULT_TARGET = "default"  # the one target influx_url makes


@dataclass(frozen=True)
class TargetConfig:
    """One named InfluxDB server a sink delivers to.

    ``influx`` is its configuration: the shared settings with its overrides
    applied (``TWOPHASE_TARGET_<NAME>_<OPTION>``), its own ``url``, and no
    ``targets`` of its own.
    """

    name: str
    influx: InfluxConfig


@dataclass(frozen=True)
class TwoPhaseConfig:
    """Everything a process of twophase needs: the staging store and InfluxDB."""

    staging: StagingConfig
    influx: InfluxConfig


def _check_pair(prefix: str, cert: str | None, key: str | None) -> None:
    """A client certificate needs its key, and a key its certificate."""
    if bool(cert) != bool(key):
        missing = f"{prefix}_key" if cert else f"{prefix}_cert"
        given = f"{prefix}_cert" if cert else f"{prefix}_key"
        raise ConfigError(env_name(missing), f"is required with {env_name(given)}")
