"""Which write API a server speaks (``auto``), and the writer for it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from twophase.config import TargetConfig, env_name
from twophase.errors import ConfigError
from twophase.influx.classify import Target, classify_status, header
from twophase.influx.http import auth_headers, request_once, secrets_of, timeout_of, tls_of
from twophase.influx.writers import InfluxWriter, V1Writer, V2Writer, V3Writer


def resolve_api(config: TargetConfig) -> TargetConfig:
    """The config with ``api`` fixed: ``auto`` is resolved once through ``GET /ping``.

    ``X-Influxdb-Version`` 1.x -> ``v1``; 2.x, 3.x, ``v2...`` or Cloud -> ``v2``.
    Raises ConfigError (naming TWOPHASE_INFLUX_API) when the server does not
    say (VictoriaMetrics' /ping, for one), TargetUnavailableError when it
    cannot be reached, TargetAuthError when /ping demands credentials that
    fail, and ConfigError from ``validate_for_api`` when the chosen API lacks
    a setting.
    """
    if config.influxdb.api == "auto":
        config = config.with_fields(api=_api_from_version(_ping_version(config)))
    config.influxdb.validate_for_api()
    return config


def _ping_version(config: TargetConfig) -> str | None:
    target = Target.of(config)
    headers = auth_headers(config.username, config.password)
    if config.influxdb.token:  # InfluxDB 3 may require auth on /ping
        headers = {"Authorization": f"Token {config.influxdb.token.reveal()}"}
    url, secrets = f"{config.url}/ping", secrets_of(config)
    response = request_once(
        "GET", url, timeout_of(config), headers, None, target, secrets, tls_of(config)
    )
    version = header(response.headers, "X-Influxdb-Version")
    if version is None and response.status in (401, 403):
        raise classify_status(response.status, response.data, response.headers, target, secrets)
    return version


def _api_from_version(version: str | None) -> str:
    option = env_name("influx_api")
    if not version:
        raise ConfigError(
            option,
            "the server's /ping sent no X-Influxdb-Version header, so the "
            "API cannot be detected; set it explicitly to v1 or v2",
        )
    text = version.strip().lower().lstrip("v")
    if text.startswith("1."):
        return "v1"
    if text.startswith(("2", "3")) or "cloud" in text:
        return "v2"
    raise ConfigError(option, f"unknown InfluxDB version {version!r}; set it to v1 or v2")


def make_writer(config: TargetConfig) -> InfluxWriter:
    """A writer for the configured API.

    With ``auto`` the API is resolved through ``/ping`` at the first write, so
    an InfluxDB that is down when a process starts is retried like any other
    outage (TargetUnavailableError) instead of failing the process at once.
    """
    if config.influxdb.api == "auto":
        return AutoWriter(config)
    config.influxdb.validate_for_api()
    writers: dict[str, Callable[[TargetConfig], InfluxWriter]]
    writers = {"v1": V1Writer, "v2": V2Writer, "v3": V3Writer}
    return writers[config.influxdb.api](config)


class AutoWriter:
    """Resolves ``auto`` on the first write (retried by the sender while unreachable)."""

    def __init__(self, config: TargetConfig) -> None:
        self._config = config
        self._inner: InfluxWriter | None = None

    def write(self, body: bytes, gzipped: bool = False) -> None:
        self._resolved().write(body, gzipped)

    def read(self, statement: str) -> Iterable[dict[str, Any]]:
        return self._resolved().read(statement)

    def _resolved(self) -> InfluxWriter:
        if self._inner is None:
            self._inner = make_writer(resolve_api(self._config))
        return self._inner

    def close(self) -> None:
        if self._inner is not None:
            self._inner.close()
