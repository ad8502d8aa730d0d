"""One HTTP request to InfluxDB, with credentials only in headers, and its answer read
within a bound.

Credentials never go into a URL, so they cannot reach logs or error messages through it;
[`credential_forms`][twophase.influx.http.credential_forms] lists every form a credential
takes on the wire, for scrubbing messages.

An answer is never read whole into memory on the server's word: an error's text
([`answer`][twophase.influx.http.answer]) is read up to ``ANSWER_BYTES`` and the rest
left unread, and a streamed answer ([`answer_lines`][twophase.influx.http.answer_lines])
line by line, each line bounded. A compressed answer (twophase asks for none, but a
server or a proxy may send one) is inflated within the same bounds
([`twophase.bounded`][twophase.bounded]), never by the HTTP client, which would inflate
it whole.
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import urllib3

from twophase.bounded import GZIP_WBITS, Inflater
from twophase.config import Secret, TargetConfig
from twophase.errors import InflateLimitError, TargetRequestError
from twophase.influx.classify import Target, header, scrubbed, transport_error

# What a request through urllib3 (or influxdb-client) raises when it got no answer:
# urllib3's errors, the socket's, and ValueError for a request the client will not
# make (a header value holding a line break: "Invalid header value b'Bearer ...'",
# or a character latin-1 lacks). Each becomes a twophase error, scrubbed of the
# secrets, by classify.transport_error; raised as it is, its text would quote them.
CLIENT_ERRORS = (urllib3.exceptions.HTTPError, OSError, ValueError)
# An error answer's text read at most: its message is cut to 500 characters, and the
# 1.x count of points it refused ("dropped=N") ends it; past this the count is not
# read and the refused body is bisected instead.
ANSWER_BYTES = 1024 * 1024
_BLOCK = 64 * 1024  # bytes of an answer read at a time
# Content-Encoding -> zlib's window bits for it.
_ENCODINGS = {"gzip": GZIP_WBITS, "x-gzip": GZIP_WBITS, "deflate": zlib.MAX_WBITS}


def secrets_of(config: TargetConfig) -> tuple[str, ...]:
    return credential_forms(config.username, config.password, config.influxdb.token)


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


def tls_of(config: TargetConfig) -> dict[str, Any]:
    """urllib3's TLS arguments for the configured CA, client certificate and key."""
    files = {"ca_certs": config.tls_ca, "cert_file": config.tls_cert, "key_file": config.tls_key}
    return {name: path for name, path in files.items() if path}


def timeout_of(config: TargetConfig) -> urllib3.Timeout:
    return urllib3.Timeout(connect=config.timeout_s, read=config.timeout_s)


def auth_headers(username: str | None, password: Secret | str | None) -> dict[str, str]:
    if not username and password is None:
        return {}
    return {"Authorization": f"Basic {_basic(username, password)}"}


@dataclass(frozen=True)
class Answer:
    """A server's answer to a rare request, its body read within ``ANSWER_BYTES``."""

    status: int
    headers: Mapping[str, str]
    data: bytes


def request_once(
    method: str,
    url: str,
    timeout: urllib3.Timeout,
    headers: dict[str, str],
    body: str | None,
    target: Target,
    secrets: Iterable[str],
    tls: Mapping[str, Any] | None = None,
) -> Answer:
    """One request on a throwaway pool (rare calls); a failed transport raises classified.
    ``tls``: urllib3's TLS arguments ([`tls_of`][twophase.influx.http.tls_of])."""
    with opened(method, url, timeout, headers, body, target, secrets, tls) as response:
        return Answer(response.status, response.headers, answer(response))


@contextmanager
def opened(
    method: str,
    url: str,
    timeout: urllib3.Timeout,
    headers: dict[str, str],
    body: str | None,
    target: Target,
    secrets: Iterable[str],
    tls: Mapping[str, Any] | None = None,
) -> Iterator[urllib3.BaseHTTPResponse]:
    """One request on a throwaway pool, its answer not read yet (``answer``,
    ``answer_lines``); a failed transport raises classified. Closed on leaving."""
    pool = urllib3.PoolManager(timeout=timeout, retries=False, **(tls or {}))
    try:
        try:
            response = pool.request(method, url, body=body, headers=headers, preload_content=False)
        except CLIENT_ERRORS as exc:
            raise scrubbed(transport_error(exc, target, secrets), secrets) from None
        try:
            yield response
        finally:
            response.close()
    finally:
        pool.clear()


def answer(response: urllib3.BaseHTTPResponse, limit: int = ANSWER_BYTES) -> bytes:
    """At most ``limit`` bytes of an answer's body, inflated within the same bound if it
    is compressed; the rest is left unread (the connection is then closed, not reused).
    A body cut short of its end, or one that does not inflate, is given as far as it
    went: what is read is a message."""
    parts: list[bytes] = []
    total = 0
    try:
        for block in _decoded(response, limit, "InfluxDB's answer"):
            parts.append(block[: limit - total])
            total += len(parts[-1])
            if total >= limit:
                response.close()
                break
        else:
            response.release_conn()
    except (InflateLimitError, TargetRequestError, zlib.error, *CLIENT_ERRORS):
        response.close()
    return b"".join(parts)


def answer_lines(response: urllib3.BaseHTTPResponse, max_line: int, what: str) -> Iterator[bytes]:
    """An answer's lines (without their line feeds), read and inflated a block at a
    time; TargetRequestError, naming ``what``, for a line longer than ``max_line``
    bytes, read no further."""
    parts: list[bytes] = []  # the line being read: joined once its end comes
    held = 0
    for block in _decoded(response, None, what):
        start = 0
        while (end := block.find(b"\n", start)) >= 0:
            parts.append(block[start:end])
            line, parts, held = b"".join(parts), [], 0
            if line.strip():
                yield line
            start = end + 1
        if start < len(block):
            parts.append(block[start:])
            held += len(block) - start
        if held > max_line:
            raise TargetRequestError(
                f"{what}: a line of the answer is longer than {max_line} bytes; not read"
            )
    line = b"".join(parts)
    if line.strip():
        yield line


def _decoded(response: urllib3.BaseHTTPResponse, limit: int | None, what: str) -> Iterator[bytes]:
    """The body's blocks as sent, inflated a step at a time when the server compressed
    them (within ``limit`` in all when given)."""
    encoding = (header(response.headers, "Content-Encoding") or "identity").strip().lower()
    wbits = _ENCODINGS.get(encoding)
    if encoding != "identity" and wbits is None:
        raise TargetRequestError(f"{what} is encoded as {encoding!r}, which twophase cannot read")
    inflater = None if wbits is None else Inflater(limit, what, wbits)
    for raw in response.stream(_BLOCK, decode_content=False):
        yield from (raw,) if inflater is None else inflater.pieces(raw)
