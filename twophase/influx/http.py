"""One HTTP request to InfluxDB, with credentials only in headers.

Credentials never go into a URL, so they cannot reach logs or error messages
through it; [`credential_forms`][twophase.influx.http.credential_forms] lists every form a
credential takes on
the wire, for scrubbing messages.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from typing import Any

import urllib3

from twophase.config import InfluxConfig, Secret
from twophase.influx.classify import Target, scrubbed, transport_error

# What a request through urllib3 (or influxdb-client) raises when it got no answer:
# urllib3's errors, the socket's, and ValueError for a request the client will not
# make (a header value holding a line break: "Invalid header value b'Bearer ...'",
# or a character latin-1 lacks). Each becomes a twophase error, scrubbed of the
# secrets, by classify.transport_error; raised as it is, its text would quote them.
CLIENT_ERRORS = (urllib3.exceptions.HTTPError, OSError, ValueError)


def secrets_of(config: InfluxConfig) -> tuple[str, ...]:
    return credential_forms(config.username, config.password, config.token)


def credential_forms(
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


def tls_of(config: InfluxConfig) -> dict[str, Any]:
    """urllib3's TLS arguments for the configured CA, client certificate and key."""
    files = {"ca_certs": config.tls_ca, "cert_file": config.tls_cert, "key_file": config.tls_key}
    return {name: path for name, path in files.items() if path}


def timeout_of(config: InfluxConfig) -> urllib3.Timeout:
    return urllib3.Timeout(connect=config.timeout_s, read=config.timeout_s)


def auth_headers(username: str | None, password: Secret | str | None) -> dict[str, str]:
    if not username and password is None:
        return {}
    return {"Authorization": f"Basic {_basic(username, password)}"}


def request_once(
    method: str,
    url: str,
    timeout: urllib3.Timeout,
    headers: dict[str, str],
    body: str | None,
    target: Target,
    secrets: Iterable[str],
    tls: Mapping[str, Any] | None = None,
) -> urllib3.BaseHTTPResponse:
    """One request on a throwaway pool (rare calls); a failed transport raises classified.
    ``tls``: urllib3's TLS arguments ([`tls_of`][twophase.influx.http.tls_of])."""
    pool = urllib3.PoolManager(timeout=timeout, retries=False, **(tls or {}))
    try:
        return pool.request(method, url, body=body, headers=headers)
    except CLIENT_ERRORS as exc:
        raise scrubbed(transport_error(exc, target, secrets), secrets) from None
    finally:
        pool.clear()
