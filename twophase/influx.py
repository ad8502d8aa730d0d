"""Writers for the InfluxDB 1.x and 2.x write APIs, and error classification.

A writer sends one body of line protocol in one attempt and never retries:
retrying, batching and bisection live in :mod:`twophase.sender`, which only
needs the small :class:`InfluxWriter` interface. Every failure is raised as a
class from :mod:`twophase.errors` (or a subclass defined here), so callers
branch on the class, never on a message:

=====================================================  =========================
connection refused/reset, timeouts, 429, 500, 502-504  :class:`TransientWriteError`
413                                                    :class:`BatchTooLargeError`
400, 422 (the points themselves are wrong)             :class:`BadPointsError`
401, 403                                               ``InfluxAuthError``
404 (and 1.x's 500 "retention policy not found")       ``InfluxNotFoundError``
anything else                                          ``InfluxRequestError``
=====================================================  =========================

Messages never contain a password or token: credentials travel only in the
``Authorization`` header, and every message is scrubbed of the secrets the
writer knows before it is raised.
"""

from __future__ import annotations

import base64
import dataclasses
import email.utils
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast
from urllib.parse import urlencode

import urllib3
from urllib3.exceptions import (
    ConnectTimeoutError,
    LocationValueError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
    SSLError,
)

from twophase.config import InfluxConfig, Secret, env_name
from twophase.errors import (
    ConfigError,
    InfluxAuthError,
    InfluxNotFoundError,
    InfluxRequestError,
    InfluxUnavailableError,
    TwoPhaseError,
)

TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
_MAX_MESSAGE = 500


class TransientWriteError(InfluxUnavailableError):
    """One attempt failed for a reason that may pass (network, overload, restart).

    ``retry_after`` is the server's Retry-After in seconds, when it sent one.
    Nothing is known about which points of the body arrived.
    """

    def __init__(
        self, message: str, status: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


class BatchTooLargeError(InfluxRequestError):
    """413: the body exceeds the server's limit; smaller bodies may pass."""


class BadPointsError(InfluxRequestError):
    """400/422: some points were refused; ``reason`` is InfluxDB's own message.

    With 1.x ("partial write: ... dropped=N") the other points of the body
    were written; which ones were refused is only known by re-sending parts.
    """

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class InfluxWriter(Protocol):
    """Sends one body of line protocol (lines joined by '\\n', ns precision) in ONE attempt.

    Idempotent in effect: InfluxDB overwrites a point with the same
    measurement, tag set and timestamp, so sending the same body again
    changes nothing. Raises a classified error; never retries itself.
    """

    def write(self, body: bytes) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Target:
    """What a request addressed, for error messages. Holds no secrets."""

    api: str
    url: str
    database: str | None = None
    retention_policy: str | None = None
    bucket: str | None = None
    org: str | None = None
    username: str | None = None

    @classmethod
    def of(cls, config: InfluxConfig) -> Target:
        return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})

    def where(self) -> str:
        if self.api == "v2":
            return f"bucket {self.bucket!r} of org {self.org!r} at {self.url}"
        rp = f", retention policy {self.retention_policy!r}" if self.retention_policy else ""
        return f"database {self.database!r}{rp} at {self.url}"


# --- classification -------------------------------------------------------------------


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After (delta-seconds or HTTP date); None if absent or bad."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # HTTP dates are GMT by definition
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def server_message(body: bytes | str | None, headers: Mapping[str, str] | None = None) -> str:
    """InfluxDB's own explanation: 1.x ``{"error": ...}``, 2.x ``{"message": ...}``, else text."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else (body or "")
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        for key in ("error", "message"):
            if isinstance(parsed.get(key), str) and parsed[key]:
                return _short(parsed[key])
    header = _header(headers, "X-Influxdb-Error")
    return _short(header or text.strip())


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every (non-trivial) secret replaced by ``***``."""
    for secret in secrets:
        if secret and len(secret) >= 3:  # don't mangle messages over a 1-2 character "secret"
            text = text.replace(secret, "***")
    return text


def classify_status(
    status: int,
    body: bytes | str | None,
    headers: Mapping[str, str] | None,
    target: Target,
    secrets: Iterable[str] = (),
) -> TwoPhaseError:
    """The exception for a non-2xx answer to a write (see the module's table)."""
    said = server_message(body, headers) or f"HTTP {status}"
    return _scrubbed(_classify(status, said, headers, target), secrets)


def _classify(
    status: int, said: str, headers: Mapping[str, str] | None, target: Target
) -> TwoPhaseError:
    where = target.where()
    if status in (400, 422):
        return BadPointsError(f"InfluxDB refused points ({status}) for {where}: {said}", said)
    if status == 413:
        return BatchTooLargeError(f"request too large (413) for {where}: {said}")
    if status in (401, 403):
        return InfluxAuthError(_auth_message(status, said, target))
    if status == 404:
        return InfluxNotFoundError(_not_found_message(said, target))
    if status == 500 and "retention policy not found" in said:
        # 1.x answers a missing retention policy with 500; retrying cannot create it
        return InfluxNotFoundError(
            f"{said} ({env_name('influx_rp')}) for {where}; create it or unset the option"
        )
    if status in TRANSIENT_STATUSES:
        retry_after = parse_retry_after(_header(headers, "Retry-After"))
        return TransientWriteError(
            f"InfluxDB unavailable ({status}) at {target.url}: {said}",
            status=status,
            retry_after=retry_after,
        )
    return InfluxRequestError(f"InfluxDB refused the request ({status}) for {where}: {said}")


def _auth_message(status: int, said: str, target: Target) -> str:
    what = "refused the credentials" if status == 401 else "denied permission"
    if target.api == "v2":
        fix = f"check {env_name('influx_token')} (or its _FILE) and its write access to the bucket"
    else:
        user = f" of user {target.username!r}" if target.username else " (no user given)"
        fix = (
            f"check {env_name('influx_user')} / {env_name('influx_password')}{user}"
            " and the user's WRITE privilege on the database"
        )
    return f"InfluxDB {what} ({status}: {said}) for {target.where()}: {fix}"


def _not_found_message(said: str, target: Target) -> str:
    if target.api == "v2":
        return (
            f"bucket or org not found: bucket {target.bucket!r} "
            f"({env_name('influx_bucket')}), org {target.org!r} ({env_name('influx_org')}) "
            f"at {target.url}: {said} (an InfluxDB before 1.8 has no /api/v2/write: "
            f"set {env_name('influx_api')}=v1)"
        )
    return (
        f"database not found: {target.database!r} ({env_name('influx_db')}) at {target.url}: {said}"
    )


def transport_error(exc: BaseException, target: Target) -> TwoPhaseError:
    """The exception for a request that got no HTTP answer (refused, reset, timed out)."""
    if isinstance(exc, SSLError) and "CERTIFICATE_VERIFY_FAILED" in str(exc):
        return InfluxRequestError(f"TLS certificate of {target.url} not trusted: {exc}")
    if isinstance(exc, LocationValueError):
        return InfluxRequestError(f"bad InfluxDB URL {target.url}: {_short(str(exc))}")
    if isinstance(exc, NewConnectionError | ConnectionRefusedError):  # before timeouts: a
        what = "cannot connect"  # NewConnectionError is also a ConnectTimeoutError in urllib3
    elif isinstance(exc, ConnectTimeoutError | ReadTimeoutError | TimeoutError):
        what = "timed out"
    elif isinstance(exc, ProtocolError | ConnectionError):
        what = "connection broken"
    else:
        what = "request failed"
    return TransientWriteError(
        f"InfluxDB at {target.url}: {what} ({type(exc).__name__}: {_short(str(exc))})"
    )


def _header(headers: Mapping[str, str] | None, name: str) -> str | None:
    if not headers:
        return None
    value = headers.get(name)
    if value is None:  # plain dicts (tests, some clients) are case-sensitive
        lowered = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == lowered), None)
    return value


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_MESSAGE else text[:_MAX_MESSAGE] + "..."


def _secrets(config: InfluxConfig) -> tuple[str, ...]:
    return _credential_forms(config.username, config.password, config.token)


def _credential_forms(
    username: str | None, password: Secret | str | None, token: Secret | None = None
) -> tuple[str, ...]:
    """Every form a credential takes on the wire (a server might echo a header back)."""
    found = [token.reveal()] if token is not None else []
    if password is not None:
        found += [
            password.reveal() if isinstance(password, Secret) else password,
            _basic(username, password),
        ]
    return tuple(found)


def _basic(username: str | None, password: Secret | str | None) -> str:
    secret = password.reveal() if isinstance(password, Secret) else (password or "")
    return base64.b64encode(f"{username or ''}:{secret}".encode()).decode()


def _timeout(config: InfluxConfig) -> urllib3.Timeout:
    return urllib3.Timeout(connect=config.timeout_s, read=config.timeout_s)


def _auth_headers(username: str | None, password: Secret | str | None) -> dict[str, str]:
    if not username and password is None:
        return {}
    return {"Authorization": f"Basic {_basic(username, password)}"}


# --- writers --------------------------------------------------------------------------


class V1Writer:
    """POST {url}/write?db=&rp=&precision=ns, user/password as HTTP basic auth.

    Credentials never go into the URL, so they cannot reach logs or error
    messages through it. urllib3's own retries are off: one call, one attempt.
    """

    def __init__(self, config: InfluxConfig) -> None:
        params = {"db": config.database or "", "precision": "ns"}
        if config.retention_policy:
            params["rp"] = config.retention_policy
        self._url = f"{config.url}/write?{urlencode(params)}"
        self._headers = {
            "Content-Type": "text/plain; charset=utf-8",
            **_auth_headers(config.username, config.password),
        }
        self._target = Target.of(dataclasses.replace(config, api="v1"))
        self._secrets = _secrets(config)
        self._pool = urllib3.PoolManager(timeout=_timeout(config), retries=False)

    def write(self, body: bytes) -> None:
        """One POST of ``body``; returns on 2xx, raises a classified error otherwise."""
        try:
            response = self._pool.request("POST", self._url, body=body, headers=self._headers)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise _scrubbed(transport_error(exc, self._target), self._secrets) from None
        if not 200 <= response.status < 300:
            raise classify_status(
                response.status, response.data, response.headers, self._target, self._secrets
            )

    def close(self) -> None:
        self._pool.clear()


class V2Writer:
    """``/api/v2/write`` through influxdb-client (SYNCHRONOUS, retries off), token auth.

    Without a token but with user and password, the 1.8 compatibility token
    ``user:password`` is used.
    """

    def __init__(self, config: InfluxConfig) -> None:
        from influxdb_client import InfluxDBClient
        from influxdb_client.client.write_api import SYNCHRONOUS

        token = config.token.reveal() if config.token else None
        if token is None and config.username and config.password:
            token = f"{config.username}:{config.password.reveal()}"
        self._target = Target.of(dataclasses.replace(config, api="v2"))
        self._secrets = _secrets(config) + ((token,) if token else ())
        self._bucket, self._org = config.bucket or "", config.org or ""
        millis = int(config.timeout_s * 1000)
        # the stubs say str/int, but None (no auth header) and (connect, read) are supported
        options: dict[str, Any] = {"token": token, "org": config.org, "timeout": (millis, millis)}
        self._client = InfluxDBClient(url=config.url, retries=False, **options)
        self._api = self._client.write_api(write_options=SYNCHRONOUS)

    def write(self, body: bytes) -> None:
        """One write of ``body``; returns on 2xx, raises a classified error otherwise."""
        from influxdb_client import WritePrecision
        from influxdb_client.rest import ApiException

        try:
            self._api.write(
                bucket=self._bucket,
                org=self._org,
                record=body,
                write_precision=cast(Any, WritePrecision.NS),
            )
        except ApiException as exc:
            raise classify_status(
                int(exc.status or 0), exc.body, exc.headers, self._target, self._secrets
            ) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise _scrubbed(transport_error(exc, self._target), self._secrets) from None

    def close(self) -> None:
        self._client.close()


def _scrubbed(error: TwoPhaseError, secrets: Iterable[str]) -> TwoPhaseError:
    secrets = list(secrets)
    error.args = (scrub(str(error.args[0]), secrets),)
    if isinstance(error, BadPointsError):
        error.reason = scrub(error.reason, secrets)
    return error


def _request_once(
    method: str,
    url: str,
    timeout: urllib3.Timeout,
    headers: dict[str, str],
    body: str | None,
    target: Target,
    secrets: Iterable[str],
) -> urllib3.BaseHTTPResponse:
    """One request on a throwaway pool (rare calls); a failed transport raises classified."""
    pool = urllib3.PoolManager(timeout=timeout, retries=False)
    try:
        return pool.request(method, url, body=body, headers=headers)
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise _scrubbed(transport_error(exc, target), secrets) from None
    finally:
        pool.clear()


# --- API resolution -------------------------------------------------------------------


def resolve_api(config: InfluxConfig) -> InfluxConfig:
    """The config with ``api`` fixed: ``auto`` is resolved once through ``GET /ping``.

    ``X-Influxdb-Version`` 1.x -> ``v1``; 2.x, 3.x, ``v2...`` or Cloud -> ``v2``.
    Raises ConfigError (naming TWOPHASE_INFLUX_API) when the server does not
    say (VictoriaMetrics' /ping, for one), InfluxUnavailableError when it
    cannot be reached, InfluxAuthError when /ping demands credentials that
    fail, and ConfigError from ``validate_for_api`` when the chosen API lacks
    a setting.
    """
    if config.api == "auto":
        config = dataclasses.replace(config, api=_api_from_version(_ping_version(config)))
    config.validate_for_api()
    return config


def _ping_version(config: InfluxConfig) -> str | None:
    target = Target.of(config)
    headers = _auth_headers(config.username, config.password)
    if config.token:  # InfluxDB 3 may require auth on /ping
        headers = {"Authorization": f"Token {config.token.reveal()}"}
    url, secrets = f"{config.url}/ping", _secrets(config)
    response = _request_once("GET", url, _timeout(config), headers, None, target, secrets)
    version = _header(response.headers, "X-Influxdb-Version")
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


def make_writer(config: InfluxConfig) -> InfluxWriter:
    """A writer for the configured API.

    With ``auto`` the API is resolved through ``/ping`` at the first write, so
    an InfluxDB that is down when a process starts is retried like any other
    outage (InfluxUnavailableError) instead of failing the process at once.
    """
    if config.api == "auto":
        return AutoWriter(config)
    config.validate_for_api()
    return V1Writer(config) if config.api == "v1" else V2Writer(config)


class AutoWriter:
    """Resolves ``auto`` on the first write (retried by the sender while unreachable)."""

    def __init__(self, config: InfluxConfig) -> None:
        self._config = config
        self._inner: InfluxWriter | None = None

    def write(self, body: bytes) -> None:
        if self._inner is None:
            self._inner = make_writer(resolve_api(self._config))
        self._inner.write(body)

    def close(self) -> None:
        if self._inner is not None:
            self._inner.close()


# --- reading back (tests, verify) -----------------------------------------------------


def query_v1(
    url: str,
    database: str | None,
    q: str,
    username: str | None = None,
    password: Secret | str | None = None,
    timeout_s: float = 10.0,
    method: str = "GET",
) -> list[dict[str, Any]]:
    """Run InfluxQL through 1.x ``/query`` (epoch=ns); the series dicts of all results.

    Use ``method="POST"`` for statements that change things (CREATE DATABASE,
    CREATE USER): the statement then travels in the body, not the URL, so a
    password in it stays out of access logs. Raises the classified errors of
    a write, and InfluxRequestError when a statement fails.
    """
    params = {"q": q, "epoch": "ns", **({"db": database} if database else {})}
    target = Target("v1", url.rstrip("/"), database, username=username)
    secrets = _credential_forms(username, password)
    headers = _auth_headers(username, password)
    query_url, body = f"{target.url}/query?{urlencode(params)}", None
    if method == "POST":
        query_url, body = f"{target.url}/query", urlencode(params)
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    timeout = urllib3.Timeout(connect=timeout_s, read=timeout_s)
    response = _request_once(method, query_url, timeout, headers, body, target, secrets)
    if response.status == 400:  # a bad statement, not bad points
        raise InfluxRequestError(scrub(f"query refused: {server_message(response.data)}", secrets))
    if not 200 <= response.status < 300:
        raise classify_status(response.status, response.data, response.headers, target, secrets)
    series: list[dict[str, Any]] = []
    for result in json.loads(response.data).get("results", []):
        if "error" in result:
            raise InfluxRequestError(scrub(f"query failed: {result['error']}", secrets))
        series.extend(result.get("series", []))
    return series
