"""Reading InfluxDB back through the 1.x ``/query`` API (``verify``, tests, the demo).

The answer is streamed (``chunked=true``): InfluxDB sends a series' rows in chunks of
at most ``ANSWER_CHUNK_ROWS``, one JSON object per line, and each is read, parsed and
given out before the next is read, so a reader holds one chunk at a time however large
the answer (see [`twophase.influx.http`][twophase.influx.http] for the bounds).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlencode

import urllib3

from twophase.config import Secret
from twophase.errors import TargetRequestError
from twophase.influx.classify import Target, classify_status, scrub, server_message
from twophase.influx.http import answer, answer_lines, auth_headers, credential_forms, opened

ANSWER_CHUNK_ROWS = 1000  # rows of a series per chunk of a streamed answer
# One chunk's JSON read at most: 1,000 rows of a few fields take kilobytes; a row of many
# 64 KiB strings could take more, and its answer is refused rather than read whole.
MAX_ANSWER_LINE = 64 * 1024 * 1024


def query_v1(
    url: str,
    database: str | None,
    q: str,
    username: str | None = None,
    password: Secret | str | None = None,
    timeout_s: float = 10.0,
    method: str = "GET",
    tls: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Run InfluxQL through 1.x ``/query`` (epoch=ns); the series dicts of all results.

    Use ``method="POST"`` for statements that change things (CREATE DATABASE,
    CREATE USER): the statement then travels in the body, not the URL, so a
    password in it stays out of access logs. Raises the classified errors of
    a write, and TargetRequestError when a statement fails.
    """
    return list(query_v1_stream(url, database, q, username, password, timeout_s, method, tls))


def query_v1_stream(
    url: str,
    database: str | None,
    q: str,
    username: str | None = None,
    password: Secret | str | None = None,
    timeout_s: float = 10.0,
    method: str = "GET",
    tls: Mapping[str, Any] | None = None,
) -> Iterator[dict[str, Any]]:
    """[`query_v1`][twophase.influx.query.query_v1] a chunk at a time: the series dicts as
    InfluxDB streams them (a series of more than ``ANSWER_CHUNK_ROWS`` rows comes as
    several dicts in a row). Lazy: the request is made when the first is asked for,
    and its connection closed when the iterator ends or is closed."""
    params = {
        "q": q,
        "epoch": "ns",
        "chunked": "true",
        "chunk_size": str(ANSWER_CHUNK_ROWS),
        **({"db": database} if database else {}),
    }
    target = Target("v1", url.rstrip("/"), database, username=username)
    secrets = credential_forms(username, password)
    headers = auth_headers(username, password)
    query_url, body = f"{target.url}/query?{urlencode(params)}", None
    if method == "POST":
        query_url, body = f"{target.url}/query", urlencode(params)
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    timeout = urllib3.Timeout(connect=timeout_s, read=timeout_s)
    with opened(method, query_url, timeout, headers, body, target, secrets, tls) as response:
        if response.status == 400:  # a bad statement, not bad points
            said = server_message(answer(response), secrets=secrets)
            raise TargetRequestError(scrub(f"query refused: {said}", secrets))
        if not 200 <= response.status < 300:
            said_bytes = answer(response)
            raise classify_status(response.status, said_bytes, response.headers, target, secrets)
        what = f"the answer of {target.url}/query"
        for line in answer_lines(response, MAX_ANSWER_LINE, what):
            yield from _series(json.loads(line), secrets)


def _series(chunk: Any, secrets: tuple[str, ...]) -> Iterator[dict[str, Any]]:
    """The series of one chunk of the answer; TargetRequestError for a failed statement."""
    if isinstance(chunk, dict) and "error" in chunk:  # the answer failed part way
        raise TargetRequestError(scrub(f"query failed: {chunk['error']}", secrets))
    for result in chunk.get("results", []) if isinstance(chunk, dict) else []:
        if "error" in result:
            raise TargetRequestError(scrub(f"query failed: {result['error']}", secrets))
        yield from result.get("series", [])


def quote_ident(name: str) -> str:
    """An InfluxQL double-quoted identifier (names are data, never query syntax)."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def window_query(measurement: str, start: int, end: int, retention_policy: str | None) -> str:
    """InfluxQL for a measurement's points between two times (inclusive, ns), by series."""
    source = quote_ident(measurement)
    if retention_policy:
        source = f"{quote_ident(retention_policy)}.{source}"
    # InfluxQL, not SQL: the names are quoted identifiers and the bounds integers.
    where = f"time >= {int(start)} AND time <= {int(end)}"
    return f"SELECT * FROM {source} WHERE {where} GROUP BY *"  # noqa: S608
