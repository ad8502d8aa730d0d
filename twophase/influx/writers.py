"""Writers for the InfluxDB 1.x, 2.x and 3 write APIs.

A writer sends one body of line protocol in one attempt and never retries: retrying,
batching and bisection live in [`twophase.targets.sender`][twophase.targets.sender], which
only needs the small [`InfluxWriter`][twophase.influx.writers.InfluxWriter] interface. Every
failure is raised classified ([`twophase.influx.classify`][twophase.influx.classify]).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol, cast
from urllib.parse import urlencode

import urllib3
from urllib3 import HTTPConnectionPool
from urllib3.util import Retry, parse_url

from twophase.config import MAX_LANES, TargetConfig
from twophase.errors import PermanentError
from twophase.influx.classify import Target, classify_status, scrubbed, transport_error
from twophase.influx.http import (
    CLIENT_ERRORS,
    answer,
    auth_headers,
    secrets_of,
    timeout_of,
    tls_of,
)
from twophase.influx.query import query_v1_stream


class InfluxWriter(Protocol):
    """An InfluxDB target's writer: the kind's
    [`TargetWriter`][twophase.targets.contract.TargetWriter] with an InfluxQL read back.
    (Another kind of store is added as a kind of target of its own:
    [`twophase.targets`][twophase.targets].)

    * ``write`` sends one body of line protocol (lines joined by '\\n', ns
      precision) in ONE attempt; ``gzipped``: the body is gzip (members end to
      end, one stream), sent with ``Content-Encoding: gzip``, which InfluxDB
      1.x, 2.x and 3 and VictoriaMetrics all read. It never retries: the sender
      ([`twophase.targets.sender`][twophase.targets.sender]) retries, splits and bisects.
    * the same body may be written again (a retry, a promotion repeated after a
      crash, an operator's resend), and must then change nothing. What a re-sent
      body does is the server's: InfluxDB 1.x, 2.x and 3 overwrite a point with
      the same measurement, tag set and timestamp (the same values again: no
      change), so it changes nothing. VictoriaMetrics keeps every sample it is
      sent, a re-sent body twice (counted twice by queries), unless it runs with
      ``-dedup.minScrapeInterval`` (``1ms`` is enough: it keeps timestamps in
      milliseconds); then it keeps one sample per series and millisecond, and a
      re-sent body changes nothing. Two *different* values of one series in one
      millisecond then keep one of them, not the later write as InfluxDB does
      (current releases keep the biggest). A new kind of target must make a
      re-sent body change nothing, or document what it needs for that.
    * every failure is raised classified ([`twophase.influx.classify`][twophase.influx.classify]):
      ``TransientWriteError`` for what may pass (retried),
      ``BatchTooLargeError`` (split), ``BadPointsError`` with the store's
      reason and, when it names one, the refused line (dead letters),
      ``TargetAuthError``/``TargetNotFoundError``/``TargetRequestError`` for
      what does not pass. Secrets never appear in a message.
    * ``read`` runs one InfluxQL statement and returns its series (``columns``,
      ``values``, ``tags``), times in ns: how ``twophase verify`` reads a
      target back. It may give them lazily, a chunk at a time (a series then
      comes as several in a row), and should, so that a large answer is never
      held whole. A store that cannot answer InfluxQL raises PermanentError
      saying so (verify then reports that target unsupported).
    """

    def write(self, body: bytes, gzipped: bool = False) -> None: ...

    def read(self, statement: str) -> Iterable[dict[str, Any]]: ...

    def close(self) -> None: ...


def _unreadable(api: str) -> PermanentError:
    return PermanentError(
        f"verify reads InfluxDB back with InfluxQL through the 1.x /query API; with the "
        f"{_API_NAMES[api]} API (TWOPHASE_INFLUX_API={api}) verification is not supported"
    )


_API_NAMES = {"v2": "2.x", "v3": "InfluxDB 3"}
_READ_TIMEOUT_S = 30.0  # a verify window's query reads far more than a write sends


class _PostWriter:
    """One POST of a body to a fixed URL on a pool of its own; credentials only in
    headers, so they cannot reach logs or error messages through the URL. urllib3's
    own retries are off: one call, one attempt.

    Everything a request needs but its body is made once, here: the headers, the
    request target (path and query, encoded), the retry policy and the connection
    pool of the URL's host. A write goes straight to that pool, skipping the pool
    manager's per-request URL parsing and pool lookup, work that would be done again
    for every request to the same URL. A redirect is not followed: its answer is
    classified like any other status."""

    def __init__(self, config: TargetConfig, api: str, url: str, headers: dict[str, str]):
        self._headers = {"Content-Type": "text/plain; charset=utf-8", **headers}
        self._gzip_headers = {**self._headers, "Content-Encoding": "gzip"}
        self._target = Target.of(config.with_fields(api=api))
        self._secrets = secrets_of(config)
        self._retries = Retry.from_int(False, redirect=False)
        self._manager = urllib3.PoolManager(
            timeout=timeout_of(config), retries=self._retries, maxsize=MAX_LANES, **tls_of(config)
        )
        self._url = url
        # Made at the first write, so that a URL urllib3 cannot use fails there, classified
        # (lanes racing to make it get the same pool from the manager).
        self._pool: HTTPConnectionPool | None = None
        self._path = ""

    def write(self, body: bytes, gzipped: bool = False) -> None:
        """One POST of ``body``; returns on 2xx, raises a classified error otherwise. The
        answer's text is read within ``http.ANSWER_BYTES``, whatever the server sends."""
        headers = self._gzip_headers if gzipped else self._headers
        try:
            pool = self._pool or self._open()
            response = pool.urlopen(
                "POST",
                self._path,
                body=body,
                headers=headers,
                retries=self._retries,
                redirect=False,
                assert_same_host=False,
                preload_content=False,
            )
        except CLIENT_ERRORS as exc:
            raise scrubbed(
                transport_error(exc, self._target, self._secrets), self._secrets
            ) from None
        said = answer(response)
        if not 200 <= response.status < 300:
            raise classify_status(
                response.status, said, response.headers, self._target, self._secrets
            )

    def read(self, statement: str) -> Iterable[dict[str, Any]]:
        raise _unreadable(self._target.api)

    def _open(self) -> HTTPConnectionPool:
        self._path = parse_url(self._url).request_uri
        self._pool = self._manager.connection_from_url(self._url)
        return self._pool

    def close(self) -> None:
        self._pool = None  # a write after this opens a new one, as the manager did
        self._manager.clear()


class V1Writer(_PostWriter):
    """POST {url}/write?db=&rp=&precision=ns, user/password as HTTP basic auth; reads
    back through ``/query``.

    A re-sent body: InfluxDB 1.x overwrites each point with the same measurement,
    tag set and timestamp, so the same body again changes nothing. VictoriaMetrics
    takes this API too, and keeps a re-sent body twice unless it runs with
    ``-dedup.minScrapeInterval`` (then one sample per series and timestamp; see
    [`InfluxWriter`][twophase.influx.writers.InfluxWriter]).
    """

    def __init__(self, config: TargetConfig) -> None:
        params = {"db": config.influxdb.database or "", "precision": "ns"}
        if config.influxdb.retention_policy:
            params["rp"] = config.influxdb.retention_policy
        url = f"{config.url}/write?{urlencode(params)}"
        super().__init__(config, "v1", url, auth_headers(config.username, config.password))
        self._config = config

    def read(self, statement: str) -> Iterator[dict[str, Any]]:
        """One InfluxQL statement through ``/query`` (its series, times in ns), streamed:
        a chunk of the answer at a time."""
        config = self._config
        return query_v1_stream(
            config.url,
            config.influxdb.database,
            statement,
            config.username,
            config.password,
            max(config.timeout_s, _READ_TIMEOUT_S),
            tls=tls_of(config),
        )


class V3Writer(_PostWriter):
    """POST {url}/api/v3/write_lp, InfluxDB 3's own write API, token as a bearer.

    ``accept_partial=false``: a request is all or nothing, and a refusal names
    the line that caused it ([`classify.refused_line`][twophase.influx.classify.refused_line]), so
    the sender re-sends the others at once instead of bisecting. ``no_sync=false``:
    acknowledged once the write-ahead log holds it, so an acknowledged epoch
    survives the server's crash. Written from InfluxDB 3's documentation and
    tested against a server that answers as it says; no 3.x server was at hand.

    A re-sent body: InfluxDB 3 overwrites a point with the same table (measurement),
    tag set and timestamp, so the same body again changes nothing.
    """

    def __init__(self, config: TargetConfig) -> None:
        params = {
            "db": config.influxdb.database or "",
            "precision": "nanosecond",
            "accept_partial": "false",
            "no_sync": "false",
        }
        url = f"{config.url}/api/v3/write_lp?{urlencode(params)}"
        token = (
            {"Authorization": f"Bearer {config.influxdb.token.reveal()}"}
            if config.influxdb.token is not None
            else {}
        )
        super().__init__(config, "v3", url, token)


class V2Writer:
    """``/api/v2/write`` through influxdb-client (SYNCHRONOUS, retries off), token auth.

    Without a token but with user and password, the 1.8 compatibility token
    ``user:password`` is used.

    A re-sent body: InfluxDB 2.x (and 1.8 and 3 through this API) overwrites a
    point with the same measurement, tag set and timestamp, so the same body again
    changes nothing. VictoriaMetrics, which takes this API too, keeps a re-sent body
    twice unless it runs with ``-dedup.minScrapeInterval`` (then one sample per
    series and timestamp; see [`InfluxWriter`][twophase.influx.writers.InfluxWriter]).
    """

    def __init__(self, config: TargetConfig) -> None:
        from influxdb_client.client.influxdb_client import InfluxDBClient
        from influxdb_client.service.write_service import WriteService

        token = config.influxdb.token.reveal() if config.influxdb.token else None
        if token is None and config.username and config.password:
            token = f"{config.username}:{config.password.reveal()}"
        self._target = Target.of(config.with_fields(api="v2"))
        self._secrets = secrets_of(config) + ((token,) if token else ())
        self._bucket, self._org = config.influxdb.bucket or "", config.influxdb.org or ""
        millis = int(config.timeout_s * 1000)
        # the stubs say str/int, but None (no auth header) and (connect, read) are supported
        options: dict[str, Any] = {
            "token": token,
            "org": config.influxdb.org,
            "timeout": (millis, millis),
        }
        tls = {"ssl_ca_cert": config.tls_ca, "cert_file": config.tls_cert}
        tls |= {"cert_key_file": config.tls_key}
        options |= {key: path for key, path in tls.items() if path}
        self._client = InfluxDBClient(
            url=config.url, retries=False, connection_pool_maxsize=MAX_LANES, **options
        )
        # The write service, not the write API: only it sends a body already gzipped
        # (Content-Encoding), and it takes bytes as they are.
        self._service = WriteService(self._client.api_client)  # type: ignore[no-untyped-call]

    def write(self, body: bytes, gzipped: bool = False) -> None:
        """One write of ``body``; returns on 2xx, raises a classified error otherwise."""
        from influxdb_client.domain.write_precision import WritePrecision
        from influxdb_client.rest import ApiException

        try:
            self._service.post_write(  # type: ignore[no-untyped-call]
                org=self._org,
                bucket=self._bucket,
                body=body,
                precision=cast(Any, WritePrecision.NS),
                content_type="text/plain; charset=utf-8",
                content_encoding="gzip" if gzipped else "identity",
            )
        except ApiException as exc:
            raise classify_status(
                int(exc.status or 0), exc.body, exc.headers, self._target, self._secrets
            ) from None
        except CLIENT_ERRORS as exc:
            raise scrubbed(
                transport_error(exc, self._target, self._secrets), self._secrets
            ) from None

    def read(self, statement: str) -> list[dict[str, Any]]:
        raise _unreadable("v2")

    def close(self) -> None:
        self._client.close()  # type: ignore[no-untyped-call]  # influxdb-client leaves it untyped
