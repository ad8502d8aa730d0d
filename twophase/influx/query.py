"""Reading InfluxDB back through the 1.x ``/query`` API (``verify``, tests, the demo)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

import urllib3

from twophase.config import Secret
from twophase.errors import InfluxRequestError
from twophase.influx.classify import Target, classify_status, scrub, server_message
from twophase.influx.http import auth_headers, credential_forms, request_once


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
    a write, and InfluxRequestError when a statement fails.
    """
    params = {"q": q, "epoch": "ns", **({"db": database} if database else {})}
    target = Target("v1", url.rstrip("/"), database, username=username)
    secrets = credential_forms(username, password)
    headers = auth_headers(username, password)
    query_url, body = f"{target.url}/query?{urlencode(params)}", None
    if method == "POST":
        query_url, body = f"{target.url}/query", urlencode(params)
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    timeout = urllib3.Timeout(connect=timeout_s, read=timeout_s)
    response = request_once(method, query_url, timeout, headers, body, target, secrets, tls)
    if response.status == 400:  # a bad statement, not bad points
        said = server_message(response.data, secrets=secrets)
        raise InfluxRequestError(scrub(f"query refused: {said}", secrets))
    if not 200 <= response.status < 300:
        raise classify_status(response.status, response.data, response.headers, target, secrets)
    series: list[dict[str, Any]] = []
    for result in json.loads(response.data).get("results", []):
        if "error" in result:
            raise InfluxRequestError(scrub(f"query failed: {result['error']}", secrets))
        series.extend(result.get("series", []))
    return series
