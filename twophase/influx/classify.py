"""InfluxDB's answers as twophase errors: one class per thing a caller can do about it.

=====================================================  =========================
connection refused/reset, timeouts, 429, 500, 502-504  ``TransientWriteError``
413                                                    ``BatchTooLargeError``
400, 422 (the points themselves are wrong)             ``BadPointsError`` (with the
                                                       line, when InfluxDB 3 names it;
                                                       with 1.x's count of refused
                                                       points, when it gives one)
401, 403                                               ``TargetAuthError``
404 (and 1.x's 500 "retention policy not found")       ``TargetNotFoundError``
anything else                                          ``TargetRequestError``
=====================================================  =========================

The classes are in [`twophase.errors`][twophase.errors]. Callers branch on the class, never
on a message. Every message is scrubbed of the secrets the caller knows
([`scrub`][twophase.influx.classify.scrub]): each piece of text from a server or a library
before it is shortened (cut to 500 characters, its whitespace collapsed), so that no
cut or re-spaced secret survives, and the whole message again before it is raised
([`scrubbed`][twophase.influx.classify.scrubbed]). A request the HTTP client refuses to
make (a ``ValueError``: a header value it cannot send, whose text quotes the value) is
an ``TargetRequestError`` with the text scrubbed.
"""

from __future__ import annotations

import email.utils
import json
import re
import ssl
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from urllib3.exceptions import (
    ConnectTimeoutError,
    HTTPError,
    LocationValueError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
    SSLError,
)

from twophase.config import env_name
from twophase.config.tls import influx_tls_error
from twophase.errors import (
    BadPointsError,
    BatchTooLargeError,
    TargetAuthError,
    TargetNotFoundError,
    TargetRequestError,
    TransientWriteError,
    TwoPhaseError,
)

if TYPE_CHECKING:
    from twophase.config import TargetConfig

TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
_MAX_MESSAGE = 500
# InfluxDB 1.x's refusals of a write (measured on 1.6.7): "partial write: <why>
# dropped=N" when it wrote the rest, N counting the points it parsed and refused (lines
# it could not parse are not counted, and when points were also dropped, not even
# named); "unable to parse '<line>': <why>", one per line, when it parsed none of them
# and so wrote nothing. Read from the error's text, as its own clients do.
_PARTIAL = "partial write:"
_UNPARSED = "unable to parse '"
_DROPPED = re.compile(r"\bdropped=(\d+)\s*$")
_ERROR_TEXT = re.compile(r'\s*\{\s*"error"\s*:\s*"(.*)', re.S)  # also of a cut answer


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
    def of(cls, config: TargetConfig) -> Target:
        influx = config.influxdb
        return cls(
            api=influx.api,
            url=config.url,
            database=influx.database,
            retention_policy=influx.retention_policy,
            bucket=influx.bucket,
            org=influx.org,
            username=config.username,
        )

    def where(self) -> str:
        if self.api == "v3":
            return f"InfluxDB 3 database {self.database!r} at {self.url}"
        if self.api == "v2":
            return f"bucket {self.bucket!r} of org {self.org!r} at {self.url}"
        rp = f", retention policy {self.retention_policy!r}" if self.retention_policy else ""
        return f"database {self.database!r}{rp} at {self.url}"


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


def server_message(
    body: bytes | str | None,
    headers: Mapping[str, str] | None = None,
    secrets: Iterable[str] = (),
) -> str:
    """InfluxDB's own explanation: 1.x ``{"error": ...}``, 2.x ``{"message": ...}``, else
    text; scrubbed of ``secrets``, then shortened."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else (body or "")
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        for key in ("error", "message"):
            if isinstance(parsed.get(key), str) and parsed[key]:
                return _short(parsed[key], secrets)
    said = header(headers, "X-Influxdb-Error")
    return _short(said or text.strip(), secrets)


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every (non-trivial) secret replaced by ``***``: as it is, with its
    whitespace collapsed, and escaped as Python shows it in an exception's text
    (``b'Bearer ...'``, with ``\\n`` for a line break)."""
    forms = {form for secret in secrets for form in _forms(secret)}
    for form in sorted(forms, key=len, reverse=True):  # the longest first: none left in part
        text = text.replace(form, "***")
    return text


def _forms(secret: str) -> tuple[str, ...]:
    """The ways a secret may appear in a message; none of 1-2 characters (a message is
    not mangled over such a "secret")."""
    if not secret or len(secret) < 3:
        return ()
    forms = (
        secret,
        " ".join(secret.split()),
        repr(secret)[1:-1],
        repr(secret.encode("utf-8"))[2:-1],
        repr(secret.encode("latin-1", "replace"))[2:-1],
    )
    return tuple(form for form in forms if len(form) >= 3)


def classify_status(
    status: int,
    body: bytes | str | None,
    headers: Mapping[str, str] | None,
    target: Target,
    secrets: Iterable[str] = (),
) -> TwoPhaseError:
    """The exception for a non-2xx answer to a write (see the module's table)."""
    secrets = list(secrets)
    said = server_message(body, headers, secrets) or f"HTTP {status}"
    refused = refused_line(body, secrets) if status == 400 and target.api == "v3" else None
    if refused is not None:  # InfluxDB 3 names the line that made it refuse the request
        line, reason, original = refused
        where = target.where()
        message = f"InfluxDB refused line {line + 1} of a request (400) for {where}: {reason}"
        error: TwoPhaseError = BadPointsError(message, reason, line, original)
    else:
        error = _classify(status, said, headers, target)
    if isinstance(error, BadPointsError) and status == 400 and target.api == "v1":
        error.dropped, error.every_line = influx1_refusal(body)
    error = scrubbed(error, secrets)
    error.http_status = status
    return error


def influx1_refusal(body: bytes | str | None) -> tuple[int | None, bool]:
    """(N of "dropped=N", whether no line was parsed) of a 1.x refusal of a write, read
    from its whole text: (None, False) when it says neither (another server, a cut
    answer, a refusal of another kind)."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else (body or "")
    try:
        parsed = json.loads(text)
    except ValueError:
        found = _ERROR_TEXT.match(text)
        said = found.group(1) if found else text.strip()
    else:
        said = parsed.get("error") if isinstance(parsed, dict) else None
        if not isinstance(said, str):
            return None, False
    if said.startswith(_UNPARSED):
        return None, True
    dropped = _DROPPED.search(said) if said.startswith(_PARTIAL) else None
    return (int(dropped.group(1)) if dropped else None), False


def refused_line(
    body: bytes | str | None, secrets: Iterable[str] = ()
) -> tuple[int, str, str | None] | None:
    """(index in the request, reason, the server's copy of the line) of the line
    InfluxDB 3 names in a refusal of a
    whole request (``accept_partial=false``): ``{"error": ..., "data": {"line_number":
    N, "error_message": ..., "original_line": ...}}``, N counted from 1. Read from the
    shape of ``data``, never from the error's wording; None for any other body."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else (body or "")
    try:
        parsed = json.loads(text)
    except ValueError:
        return None
    data = parsed.get("data") if isinstance(parsed, dict) else None
    if not isinstance(data, dict):
        return None
    number, reason = data.get("line_number"), data.get("error_message")
    if not isinstance(number, int) or isinstance(number, bool) or number < 1:
        return None
    original = data.get("original_line")
    said = _short(reason, secrets) if isinstance(reason, str) and reason else "refused"
    return number - 1, said, original if isinstance(original, str) else None


def _classify(
    status: int, said: str, headers: Mapping[str, str] | None, target: Target
) -> TwoPhaseError:
    where = target.where()
    if status in (400, 422):
        return BadPointsError(f"InfluxDB refused points ({status}) for {where}: {said}", said)
    if status == 413:
        return BatchTooLargeError(f"request too large (413) for {where}: {said}")
    if status in (401, 403):
        return TargetAuthError(_auth_message(status, said, target))
    if status == 404:
        return TargetNotFoundError(_not_found_message(said, target))
    if status == 500 and "retention policy not found" in said:
        # 1.x answers a missing retention policy with 500; retrying cannot create it
        return TargetNotFoundError(
            f"{said} ({env_name('influx_rp')}) for {where}; create it or unset the option"
        )
    if status in TRANSIENT_STATUSES:
        retry_after = parse_retry_after(header(headers, "Retry-After"))
        return TransientWriteError(
            f"InfluxDB unavailable ({status}) at {target.url}: {said}",
            status=status,
            retry_after=retry_after,
        )
    return TargetRequestError(f"InfluxDB refused the request ({status}) for {where}: {said}")


def _auth_message(status: int, said: str, target: Target) -> str:
    what = "refused the credentials" if status == 401 else "denied permission"
    if target.api in ("v2", "v3"):
        where = "bucket" if target.api == "v2" else "database"
        fix = f"check {env_name('influx_token')} (or its _FILE) and its write access to the {where}"
    else:
        user = f" of user {target.username!r}" if target.username else " (no user given)"
        fix = (
            f"check {env_name('target_username')} / {env_name('target_password')}{user}"
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


def transport_error(
    exc: BaseException, target: Target, secrets: Iterable[str] = ()
) -> TwoPhaseError:
    """The exception for a request that got no HTTP answer (refused, reset, timed out),
    or that the HTTP client would not make (a ``ValueError``: a header value it cannot
    send, say); its text scrubbed of ``secrets`` before it is shortened."""
    secrets = list(secrets)
    said = scrub(str(exc), secrets)
    tls = influx_tls_error(said) if isinstance(exc, SSLError | ssl.SSLError) else None
    if tls is None and "SSLError" in said:  # wrapped (MaxRetryError, ProxyError)
        tls = influx_tls_error(said)
    if tls is not None:  # permanent: fails at once, naming the setting to fix
        return tls
    if isinstance(exc, LocationValueError):
        return TargetRequestError(f"bad InfluxDB URL {target.url}: {_short(said, secrets)}")
    if not isinstance(exc, HTTPError | OSError):  # permanent: the same request again fails so
        return TargetRequestError(
            f"InfluxDB at {target.url}: the request cannot be made "
            f"({type(exc).__name__}: {_short(said, secrets)})"
        )
    if isinstance(exc, NewConnectionError | ConnectionRefusedError):  # before timeouts: a
        what = "cannot connect"  # NewConnectionError is also a ConnectTimeoutError in urllib3
    elif isinstance(exc, ConnectTimeoutError | ReadTimeoutError | TimeoutError):
        what = "timed out"
    elif isinstance(exc, ProtocolError | ConnectionError):
        what = "connection broken"
    else:
        what = "request failed"
    return TransientWriteError(
        f"InfluxDB at {target.url}: {what} ({type(exc).__name__}: {_short(said, secrets)})"
    )


def header(headers: Mapping[str, str] | None, name: str) -> str | None:
    if not headers:
        return None
    value = headers.get(name)
    if value is None:  # plain dicts (tests, some clients) are case-sensitive
        lowered = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == lowered), None)
    return value


def _short(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` on one line, at most 500 characters: scrubbed of ``secrets`` first (and
    again once re-spaced), so that no secret is cut or re-spaced out of reach."""
    secrets = list(secrets)
    text = scrub(" ".join(scrub(text, secrets).split()), secrets)
    return text if len(text) <= _MAX_MESSAGE else text[:_MAX_MESSAGE] + "..."


def scrubbed(error: TwoPhaseError, secrets: Iterable[str]) -> TwoPhaseError:
    """``error`` with its message (and a refused point's reason) scrubbed of ``secrets``:
    the last pass over the whole message before it is raised."""
    secrets = list(secrets)
    error.args = (scrub(str(error.args[0]), secrets),)
    if isinstance(error, BadPointsError):
        error.reason = scrub(error.reason, secrets)
    return error
