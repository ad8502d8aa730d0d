"""The frozen configurations: the staging store's, the targets', and both together.

Their fields are the table's settings of their section (``Setting.attr``), with
the table's defaults. A client certificate without its key, or a key without its
certificate, is refused when the object is made. A sink delivers to one or more
named targets ([`NamedTarget`][twophase.config.sections.NamedTarget]), each with a
[`TargetConfig`][twophase.config.sections.TargetConfig] of its own, whose
``influxdb`` and ``postgresql`` sections hold what only that kind reads. The
exporter's settings are an [`ExporterConfig`][twophase.config.sections.ExporterConfig];
a Prometheus endpoint (the exporter's, the driver's) is an
[`EndpointConfig`][twophase.config.sections.EndpointConfig].
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any
from urllib.parse import urlsplit

from twophase.config import sslmode, urls
from twophase.config.settings import INFLUXDB, POSTGRESQL, TARGET, default, env_name
from twophase.config.values import Secret, mask_url
from twophase.deprecation import warn_deprecated
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
    history_retention_s: float = default("history_retention")
    connect_timeout_s: float = default("staging_connect_timeout")
    retry_deadline_s: float = default("staging_retry_deadline")
    lock_timeout_s: float = default("staging_lock_timeout")
    session_timeout_s: float = default("staging_session_timeout")
    chunk_points: int = default("staging_chunk_points")
    chunk_chars: int = default("staging_chunk_chars")
    spool_memory: int = default("staging_spool_memory")
    driver_staging_bytes: int = default("driver_staging_bytes")
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
        TLS files as libpq parameters, and verified TLS for a host that is not loopback
        unless the URL chooses its sslmode ([`sslmode`][twophase.config.sslmode])."""
        return self._url().render(scheme="postgresql")

    def sqlalchemy_url(self) -> str:
        """The URL with the psycopg driver named (Alembic's engine)."""
        return self._url().render(scheme="postgresql+psycopg")

    def _url(self) -> urls.DbUrl:
        url = urls.DbUrl.parse(self.url.reveal())
        given = url.params()
        sslmode.warn_weak_mode(self.display_url, url.hosts, given)
        params = {"sslrootcert": self.tls_ca, "sslcert": self.tls_cert, "sslkey": self.tls_key}
        params |= sslmode.tls_params(url.hosts, given, self.tls_ca)
        return url.with_params({k: v for k, v in params.items() if v})


@dataclass(frozen=True)
class InfluxDBSettings:
    """The settings only the InfluxDB kind reads (section ``influxdb``).

    ``api`` is ``v1`` (``/write``: database, retention policy, user/password),
    ``v2`` (``/api/v2/write`` via influxdb-client: org, bucket, token), ``v3``
    (InfluxDB 3's ``/api/v3/write_lp``: database, token) or ``auto`` (resolved
    once through ``/ping``, never to ``v3``; see
    [`twophase.influx.api.resolve_api`][twophase.influx.api.resolve_api]).
    """

    api: str = default("influx_api")
    database: str | None = None
    retention_policy: str | None = None
    org: str | None = None
    bucket: str | None = None
    token: Secret | None = None

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


@dataclass(frozen=True)
class PostgreSQLSettings:
    """The settings only the PostgreSQL kind reads (section ``postgresql``): the schema
    of its tables, whether it creates them, and its sessions' timeouts."""

    schema: str = default("target_schema")
    create_tables: bool = default("target_create_tables")
    lock_timeout_s: float = default("target_lock_timeout")
    statement_timeout_s: float = default("target_statement_timeout")


@dataclass(frozen=True)
class TargetConfig:
    """Where and how to deliver to a target, of any kind.

    The fields are the settings every kind reads; ``influxdb`` and ``postgresql`` are
    the settings only that kind reads
    ([`InfluxDBSettings`][twophase.config.sections.InfluxDBSettings],
    [`PostgreSQLSettings`][twophase.config.sections.PostgreSQLSettings]). A kind of
    one's own reads the common fields and its URL.

    ``targets`` are the named targets of a sink with several (the ``targets``
    setting); empty when ``target_url`` names the one target. With targets,
    ``url`` is the first target's, so code that talks to one target keeps
    working, and the other fields are the settings the targets share; each
    target's own (overrides applied) is in its
    [`NamedTarget`][twophase.config.sections.NamedTarget].
    `named_targets` gives the targets either way.
    """

    url: str
    kind: str = default("target_kind")
    influxdb: InfluxDBSettings = InfluxDBSettings()
    postgresql: PostgreSQLSettings = PostgreSQLSettings()
    timeout_s: float = default("target_timeout")
    batch_points: int = default("target_batch_points")
    batch_bytes: int = default("target_batch_bytes")
    retry_deadline_s: float = default("target_retry_deadline")
    retry_initial_s: float = default("target_retry_initial")
    retry_max_s: float = default("target_retry_max")
    username: str | None = None
    password: Secret | None = None
    allow_plaintext_credentials: bool = default("allow_plaintext_credentials")
    promotion: str = default("promotion")
    metrics_port: int | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    targets: tuple[NamedTarget, ...] = ()
    min_targets: int = default("min_targets")
    target_deadline_s: float = default("target_deadline")
    target_max_lag_s: float = default("target_max_lag")
    target_max_backlog_bytes: int = default("target_max_backlog_bytes")
    target_catch_up_rate: int = default("target_catch_up_rate")
    metrics_host: str = default("metrics_host")
    metrics_tls_cert: str | None = None
    metrics_tls_key: str | None = None
    metrics_tls_client_ca: str | None = None

    def __post_init__(self) -> None:
        _check_pair("target_tls", self.tls_cert, self.tls_key)
        _check_endpoint(
            "metrics", self.metrics_tls_cert, self.metrics_tls_key, self.metrics_tls_client_ca
        )

    @property
    def metrics_endpoint(self) -> EndpointConfig | None:
        """The driver's metrics endpoint (``metrics_*``); None when ``metrics_port`` is unset."""
        if self.metrics_port is None:
            return None
        return EndpointConfig(
            "metrics",
            self.metrics_host,
            self.metrics_port,
            self.metrics_tls_cert,
            self.metrics_tls_key,
            self.metrics_tls_client_ca,
        )

    def named_targets(self) -> tuple[NamedTarget, ...]:
        """The targets, or the one (named
        [`DEFAULT_TARGET`][twophase.config.sections.DEFAULT_TARGET]) that ``target_url`` makes."""
        return self.targets or (NamedTarget(DEFAULT_TARGET, self),)

    @property
    def is_influx(self) -> bool:
        """Whether the target is InfluxDB (or VictoriaMetrics): ``target_kind`` says
        ``influxdb``, or is ``auto`` with an http(s) URL. Only then does its ``influxdb``
        section (``influx_api``, ``influx_db``...) apply to it."""
        if self.kind != "auto":
            return self.kind == "influxdb"
        return urlsplit(self.url).scheme in ("http", "https")

    def with_fields(self, **changes: Any) -> TargetConfig:
        """A copy with fields replaced by name, a kind's own (``database``, ``schema``...)
        in its section: ``config.with_fields(api="v2", timeout_s=5.0)``."""
        values: dict[str, dict[str, Any]] = {TARGET: {}, INFLUXDB: {}, POSTGRESQL: {}}
        for name, value in changes.items():
            values[_SECTION_OF.get(name, TARGET)][name] = value
        return self.with_settings(values)

    def with_settings(self, values: Mapping[str, Mapping[str, Any]]) -> TargetConfig:
        """A copy with fields replaced, by section (``target``, ``influxdb``,
        ``postgresql``) and field: how a target's overrides are applied."""
        return replace(
            self,
            influxdb=replace(self.influxdb, **values.get(INFLUXDB, {})),
            postgresql=replace(self.postgresql, **values.get(POSTGRESQL, {})),
            **values.get(TARGET, {}),
        )


DEFAULT_TARGET = "default"  # the one target target_url makes

# A kind's own field -> its section (every other field is the target's).
_SECTION_OF = {f.name: INFLUXDB for f in fields(InfluxDBSettings)} | {
    f.name: POSTGRESQL for f in fields(PostgreSQLSettings)
}


@dataclass(frozen=True)
class NamedTarget:
    """One named target a sink delivers to.

    ``config`` is its configuration: the shared settings with its overrides
    applied (``TWOPHASE_TARGET_<NAME>_<OPTION>``), its own ``url``, and no
    ``targets`` of its own.
    """

    name: str
    config: TargetConfig

    @property
    def influx(self) -> TargetConfig:
        """Deprecated: ``config``."""
        warn_deprecated("twophase.config.NamedTarget.influx", "NamedTarget.config", stacklevel=2)
        return self.config


@dataclass(frozen=True)
class TwoPhaseConfig:
    """Everything a process of twophase needs: the staging store and the targets."""

    staging: StagingConfig
    target: TargetConfig

    @property
    def influx(self) -> TargetConfig:
        """Deprecated: ``target``."""
        warn_deprecated(
            "twophase.config.TwoPhaseConfig.influx", "TwoPhaseConfig.target", stacklevel=2
        )
        return self.target


@dataclass(frozen=True)
class EndpointConfig:
    """Where a Prometheus endpoint listens, and its TLS, which prometheus_client serves:
    ``tls_cert`` and ``tls_key`` make it https; ``tls_client_ca`` also wants of every
    scraper a client certificate that CA signed (mutual TLS). ``prefix`` names its
    settings (``metrics``: the driver's; ``exporter``), which errors name. Port 0: any
    free port."""

    prefix: str
    host: str
    port: int
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None

    def __post_init__(self) -> None:
        _check_endpoint(self.prefix, self.tls_cert, self.tls_key, self.tls_client_ca)

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert else "http"


@dataclass(frozen=True)
class ExporterConfig:
    """The exporter of the store's metrics (``twophase metrics serve``): where it
    listens, its TLS, and how long a read of the store answers scrapes (``cache_s``)."""

    host: str = default("exporter_host")
    port: int = default("exporter_port")
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    cache_s: float = default("exporter_cache")

    def __post_init__(self) -> None:
        _check_endpoint("exporter", self.tls_cert, self.tls_key, self.tls_client_ca)

    @property
    def endpoint(self) -> EndpointConfig:
        return EndpointConfig(
            "exporter", self.host, self.port, self.tls_cert, self.tls_key, self.tls_client_ca
        )


def _check_endpoint(prefix: str, cert: str | None, key: str | None, client_ca: str | None) -> None:
    """An endpoint's certificate needs its key (and the key its certificate); a client CA
    (mutual TLS) needs the endpoint to speak TLS at all."""
    _check_pair(f"{prefix}_tls", cert, key)
    if client_ca and not cert:
        raise ConfigError(
            env_name(f"{prefix}_tls_client_ca"),
            f"needs {env_name(f'{prefix}_tls_cert')} and {env_name(f'{prefix}_tls_key')}: "
            "client certificates are asked for over https only",
        )


def _check_pair(prefix: str, cert: str | None, key: str | None) -> None:
    """A client certificate needs its key, and a key its certificate."""
    if bool(cert) != bool(key):
        missing = f"{prefix}_key" if cert else f"{prefix}_cert"
        given = f"{prefix}_cert" if cert else f"{prefix}_key"
        raise ConfigError(env_name(missing), f"is required with {env_name(given)}")
