"""Error classification of the InfluxDB writers, Retry-After, API detection, secrecy.

Pure logic, plus a stub HTTP server on 127.0.0.1 for what only a real
request shows (headers sent, credentials kept out of URLs and messages).
"""

from __future__ import annotations

import base64
import json
import urllib.parse
from email.utils import formatdate
from typing import Any

import pytest
from urllib3 import HTTPHeaderDict
from urllib3.exceptions import NewConnectionError, ProtocolError, ReadTimeoutError, SSLError

from twophase.config import InfluxDBSettings, Secret, TargetConfig
from twophase.errors import (
    BadPointsError,
    BatchTooLargeError,
    ConfigError,
    RetryableError,
    TargetAuthError,
    TargetNotFoundError,
    TargetRequestError,
    TargetUnavailableError,
    TransientWriteError,
    TwoPhaseError,
)
from twophase.influx.api import make_writer, resolve_api
from twophase.influx.classify import (
    Target,
    classify_status,
    parse_retry_after,
    scrub,
    server_message,
    transport_error,
)
from twophase.influx.query import query_v1
from twophase.influx.writers import V1Writer, V2Writer, V3Writer

V1 = Target("v1", "http://influx:8086", database="metrics", username="writer")
V2 = Target("v2", "http://influx:8086", bucket="metrics", org="acme")
PASSWORD = "pa55-Very-Secret"
TOKEN = "tok-Very-Secret-123=="

# --- statuses --------------------------------------------------------------------------


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
def test_transient_statuses(status: int) -> None:
    error = classify_status(status, b'{"error":"timeout"}', {}, V1)
    assert type(error) is TransientWriteError
    assert isinstance(error, TargetUnavailableError) and isinstance(error, RetryableError)
    assert error.status == status and error.retry_after is None
    assert "timeout" in str(error)


def test_413_is_batch_too_large() -> None:
    error = classify_status(413, b'{"error":"Request Entity Too Large"}', {}, V1)
    assert type(error) is BatchTooLargeError and isinstance(error, TargetRequestError)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (
            b'{"error":"partial write: field type conflict: input field \\"f\\" on measurement '
            b'\\"m\\" is type float, already exists as type integer dropped=1"}',
            'partial write: field type conflict: input field "f" on measurement "m" is type float, '
            "already exists as type integer dropped=1",
        ),
        (
            b'{"error":"unable to parse \'m f= 7\': missing field value"}',
            "unable to parse 'm f= 7': missing field value",
        ),
        (
            b'{"code":"invalid","message":"unable to parse \'x\': missing fields"}',
            "unable to parse 'x': missing fields",
        ),
    ],
)
def test_400_carries_the_servers_reason(body: bytes, reason: str) -> None:
    error = classify_status(400, body, {}, V1)
    assert type(error) is BadPointsError and error.reason == reason
    assert reason in str(error)


def test_422_is_bad_points_too() -> None:
    body = b'{"code":"unprocessable entity","message":"points beyond retention policy dropped=1"}'
    error = classify_status(422, body, {}, V2)
    assert isinstance(error, BadPointsError)
    assert error.reason == "points beyond retention policy dropped=1"


@pytest.mark.parametrize("status", [401, 403])
def test_auth_errors_name_the_settings_to_fix(status: int) -> None:
    v1 = classify_status(status, b'{"error":"authorization failed"}', {}, V1)
    assert type(v1) is TargetAuthError
    assert "TWOPHASE_TARGET_USERNAME" in str(v1) and "TWOPHASE_TARGET_PASSWORD" in str(v1)
    assert "'writer'" in str(v1) and "authorization failed" in str(v1)
    v2 = classify_status(status, b'{"code":"unauthorized","message":"unauthorized access"}', {}, V2)
    assert type(v2) is TargetAuthError and "TWOPHASE_INFLUX_TOKEN" in str(v2)


def test_404_names_the_database_or_bucket() -> None:
    v1 = classify_status(404, b'{"error":"database not found: \\"metrics\\""}', {}, V1)
    assert type(v1) is TargetNotFoundError
    assert str(v1).startswith("database not found: 'metrics' (TWOPHASE_INFLUX_DB)")
    v2 = classify_status(
        404, b'{"code":"not found","message":"bucket \\"metrics\\" not found"}', {}, V2
    )
    assert type(v2) is TargetNotFoundError
    assert "TWOPHASE_INFLUX_BUCKET" in str(v2) and "'metrics'" in str(v2)


def test_1x_missing_retention_policy_is_not_found_not_transient() -> None:
    target = Target("v1", "http://i", database="metrics", retention_policy="norp")
    error = classify_status(500, b'{"error":"retention policy not found: norp"}', {}, target)
    assert type(error) is TargetNotFoundError and "TWOPHASE_INFLUX_RP" in str(error)


@pytest.mark.parametrize("status", [301, 405, 418, 501])
def test_other_statuses_are_plain_request_errors(status: int) -> None:
    assert type(classify_status(status, b"nope", {}, V1)) is TargetRequestError


# --- bodies and headers ---------------------------------------------------------------


def test_server_message_sources() -> None:
    assert server_message(b'{"error":"e1"}') == "e1"
    assert server_message(b'{"code":"c","message":"m2"}') == "m2"
    assert server_message(b"", {"X-Influxdb-Error": "from header"}) == "from header"
    assert server_message(b"404 page not found\n") == "404 page not found"
    assert server_message(b"[1, 2]") == "[1, 2]"
    assert server_message(None) == ""
    assert server_message(b"x" * 2000).endswith("...") and len(server_message(b"x" * 2000)) < 600
    assert classify_status(503, b"", {}, V1).args[0].endswith("HTTP 503")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("7", 7.0),
        (" 1.5 ", 1.5),
        ("-3", 0.0),
        ("", None),
        (None, None),
        ("soon", None),
    ],
)
def test_parse_retry_after_seconds(value: str | None, expected: float | None) -> None:
    assert parse_retry_after(value) == expected


def test_parse_retry_after_http_date() -> None:
    now = 1_800_000_000.0
    assert parse_retry_after(formatdate(now + 30, usegmt=True), now=now) == pytest.approx(30)
    assert parse_retry_after(formatdate(now - 30, usegmt=True), now=now) == 0.0


@pytest.mark.parametrize(
    "headers",
    [
        {"Retry-After": "12"},
        {"retry-after": "12"},
        HTTPHeaderDict({"RETRY-AFTER": "12"}),
    ],
)
def test_retry_after_reaches_the_error_whatever_the_header_case(headers: Any) -> None:
    for status in (429, 503):
        error = classify_status(status, b"", headers, V2)
        assert isinstance(error, TransientWriteError) and error.retry_after == 12.0


# --- transport ------------------------------------------------------------------------


def test_transport_errors_are_transient() -> None:
    refused = NewConnectionError(None, "Failed to establish a new connection: refused")  # type: ignore[arg-type]
    timeout = ReadTimeoutError(None, "/write", "Read timed out.")  # type: ignore[arg-type]
    reset = ProtocolError("Connection aborted.", ConnectionResetError(104, "reset"))
    for exc, word in [
        (refused, "cannot connect"),
        (timeout, "timed out"),
        (reset, "connection broken"),
        (ConnectionResetError(), "connection broken"),
        (TimeoutError(), "timed out"),
    ]:
        error = transport_error(exc, V1)
        assert type(error) is TransientWriteError and word in str(error), exc
        assert error.retry_after is None and error.status is None


@pytest.mark.parametrize(
    ("message", "option"),
    [
        ("[SSL: CERTIFICATE_VERIFY_FAILED] self-signed certificate", "TWOPHASE_TARGET_TLS_CA"),
        (
            "[SSL: CERTIFICATE_VERIFY_FAILED] Hostname mismatch, certificate is not valid for "
            "'127.0.0.1'",
            "TWOPHASE_TARGET_URL",
        ),
        (
            "[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required",
            "TWOPHASE_TARGET_TLS_CERT",
        ),
        ("[SSL: WRONG_VERSION_NUMBER] wrong version number", "TWOPHASE_TARGET_URL"),
    ],
)
def test_tls_failures_are_permanent_naming_the_setting(message: str, option: str) -> None:
    error = transport_error(SSLError(message), V1)
    assert isinstance(error, ConfigError) and error.option == option


# --- API detection --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "api"),
    [
        ("1.6.7~rc0", "v1"),
        ("1.8.10", "v1"),
        ("v2.7.4", "v2"),
        ("2.0.0-beta", "v2"),
        ("3.0.1", "v2"),
        ("v3.0.0", "v2"),
    ],
)
def test_resolve_api_from_ping(stub: Any, version: str, api: str) -> None:
    stub.reply = (204, {"X-Influxdb-Version": version}, b"")
    config = TargetConfig(
        url=stub.url, influxdb=InfluxDBSettings(database="d", bucket="b", org="o")
    )
    assert resolve_api(config).influxdb.api == api
    assert stub.seen[-1][:2] == ("GET", "/ping")


def test_resolve_api_without_version_header_asks_to_set_it(stub: Any) -> None:
    stub.reply = (204, {"X-Server-Hostname": "vm"}, b"")  # what VictoriaMetrics answers
    with pytest.raises(ConfigError) as caught:
        resolve_api(TargetConfig(url=stub.url, influxdb=InfluxDBSettings(database="d")))
    assert caught.value.option == "TWOPHASE_INFLUX_API"
    stub.reply = (204, {"X-Influxdb-Version": "0.9.6"}, b"")
    with pytest.raises(ConfigError, match=r"0\.9\.6"):
        resolve_api(TargetConfig(url=stub.url, influxdb=InfluxDBSettings(database="d")))


def test_resolve_api_validates_and_keeps_explicit_choice(stub: Any) -> None:
    stub.reply = (204, {"X-Influxdb-Version": "1.8.10"}, b"")
    with pytest.raises(ConfigError) as caught:
        resolve_api(TargetConfig(url=stub.url))  # v1 without a database
    assert caught.value.option == "TWOPHASE_INFLUX_DB"
    assert (
        resolve_api(
            TargetConfig(
                url="http://127.0.0.1:1", influxdb=InfluxDBSettings(api="v1", database="d")
            )
        ).influxdb.api
        == "v1"
    )
    assert isinstance(
        make_writer(TargetConfig(url=stub.url, influxdb=InfluxDBSettings(api="v1", database="d"))),
        V1Writer,
    )
    lazy = make_writer(
        TargetConfig(url=stub.url, influxdb=InfluxDBSettings(database="d"))
    )  # auto: pings at first write
    assert not isinstance(lazy, V1Writer)


def test_resolve_api_unreachable_is_unavailable() -> None:
    with pytest.raises(TargetUnavailableError):
        resolve_api(
            TargetConfig(
                url="http://127.0.0.1:1", timeout_s=2, influxdb=InfluxDBSettings(database="d")
            )
        )


# --- secrets --------------------------------------------------------------------------


def _echo_secrets(stub: Any, status: int, secret: str) -> None:
    """A pathological server whose error message repeats the credentials it got."""
    basic = base64.b64encode(f"writer:{secret}".encode()).decode()
    said = f"bad {secret}, header Basic {basic}"
    stub.reply = (
        status,
        {"Content-Type": "application/json", "X-Influxdb-Error": said},
        json.dumps({"error": said, "message": said}).encode(),
    )


def _assert_secret_free(error: BaseException) -> None:
    for text in (str(error), repr(error), str(getattr(error, "reason", ""))):
        assert PASSWORD not in text and TOKEN not in text
        assert base64.b64encode(f"writer:{PASSWORD}".encode()).decode() not in text


@pytest.mark.parametrize("status", [301, 307, 308])
def test_a_redirect_is_not_followed_and_fails_as_a_request_error(stub: Any, status: int) -> None:
    """A redirect would carry the credentials to wherever it points; it is refused at
    once, never retried (a URL to fix), with the request sent once."""
    stub.reply = (status, {"Location": "http://127.0.0.1:1/write"}, b"moved")
    writer = V1Writer(
        TargetConfig(
            url=stub.url,
            username="writer",
            password=None,
            influxdb=InfluxDBSettings(api="v1", database="d"),
        )
    )
    with pytest.raises(TargetRequestError, match=str(status)) as caught:
        writer.write(b"m f=1i 1")
    writer.close()
    assert not isinstance(caught.value, TargetUnavailableError)
    assert [seen[:2] for seen in stub.seen] == [("POST", "/write?db=d&precision=ns")]


def test_the_writer_sends_its_fixed_headers_and_query_on_every_request(stub: Any) -> None:
    config = TargetConfig(
        url=stub.url, influxdb=InfluxDBSettings(api="v1", database="d b", retention_policy="r&p")
    )
    writer = V1Writer(config)
    writer.write(b"m f=1i 1", gzipped=True)
    writer.write(b"m f=1i 2")
    writer.close()
    (_, first, gzipped, _), (_, second, plain, _) = stub.seen
    assert first == second == "/write?db=d+b&precision=ns&rp=r%26p"
    assert gzipped["content-encoding"] == "gzip" and "content-encoding" not in plain
    assert gzipped["content-type"] == plain["content-type"] == "text/plain; charset=utf-8"
    assert "authorization" not in plain


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 500, 503, 418])
def test_v1_writer_never_puts_the_password_in_urls_or_messages(stub: Any, status: int) -> None:
    _echo_secrets(stub, status, PASSWORD)
    config = TargetConfig(
        url=stub.url,
        username="writer",
        password=Secret(PASSWORD),
        timeout_s=5,
        influxdb=InfluxDBSettings(api="v1", database="metrics"),
    )
    writer = V1Writer(config)
    with pytest.raises(TwoPhaseError) as caught:
        writer.write(b"m f=1i 1")
    writer.close()
    _assert_secret_free(caught.value)
    method, path, headers, body = stub.seen[-1]
    assert (method, body) == ("POST", b"m f=1i 1")
    assert path == "/write?db=metrics&precision=ns" and PASSWORD not in path
    expected = base64.b64encode(f"writer:{PASSWORD}".encode()).decode()
    assert headers["authorization"] == f"Basic {expected}"


@pytest.mark.parametrize("status", [400, 401, 404, 500])
def test_v2_writer_never_puts_the_token_in_messages(stub: Any, status: int) -> None:
    _echo_secrets(stub, status, TOKEN)
    config = TargetConfig(
        url=stub.url,
        timeout_s=5,
        influxdb=InfluxDBSettings(api="v2", bucket="metrics", org="acme", token=Secret(TOKEN)),
    )
    writer = V2Writer(config)
    with pytest.raises(TwoPhaseError) as caught:
        writer.write(b"m f=1i 1")
    writer.close()
    _assert_secret_free(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    method, path, headers, body = stub.seen[-1]
    assert method == "POST" and path.startswith("/api/v2/write?") and "precision=ns" in path
    assert TOKEN not in path and headers["authorization"] == f"Token {TOKEN}"
    assert body == b"m f=1i 1"


def test_v2_writer_classifies_like_v1(stub: Any) -> None:
    stub.reply = (503, {"Retry-After": "3"}, b'{"code":"unavailable","message":"busy"}')
    writer = V2Writer(
        TargetConfig(url=stub.url, influxdb=InfluxDBSettings(api="v2", bucket="b", org="o"))
    )
    with pytest.raises(TransientWriteError) as caught:
        writer.write(b"m f=1i 1")
    assert caught.value.retry_after == 3.0 and caught.value.status == 503
    stub.reply = (400, {}, b'{"code":"invalid","message":"unable to parse \'m\'"}')
    with pytest.raises(BadPointsError) as bad:
        writer.write(b"m")
    assert bad.value.reason == "unable to parse 'm'"
    writer.close()


def test_query_v1_errors_are_secret_free(stub: Any) -> None:
    _echo_secrets(stub, 401, PASSWORD)
    with pytest.raises(TargetAuthError) as caught:
        query_v1(stub.url, "metrics", "SELECT * FROM m", "writer", Secret(PASSWORD))
    _assert_secret_free(caught.value)
    stub.reply = (200, {}, b'{"results":[{"statement_id":0,"error":"boom"}]}')
    with pytest.raises(TargetRequestError, match="boom"):
        query_v1(stub.url, "metrics", "SELECT * FROM m")
    assert "epoch=ns" in stub.seen[-1][1]


def test_transport_messages_are_secret_free() -> None:
    config = TargetConfig(
        url="http://127.0.0.1:1",
        username="writer",
        password=Secret(PASSWORD),
        timeout_s=2,
        influxdb=InfluxDBSettings(api="v1", database="metrics"),
    )
    with pytest.raises(TransientWriteError) as caught:
        V1Writer(config).write(b"m f=1i 1")
    _assert_secret_free(caught.value)


def test_query_v1_post_keeps_the_statement_out_of_the_url(stub: Any) -> None:
    stub.reply = (200, {}, b'{"results":[{"statement_id":0}]}')
    statement = f"CREATE USER u WITH PASSWORD '{PASSWORD}'"
    assert query_v1(stub.url, None, statement, method="POST") == []
    method, path, headers, body = stub.seen[-1]
    assert (method, path) == ("POST", "/query") and PASSWORD not in path
    assert headers["content-type"] == "application/x-www-form-urlencoded"
    assert urllib.parse.parse_qs(body.decode()) == {
        "q": [statement],
        "epoch": ["ns"],
        "chunked": ["true"],  # streamed: a chunk of the answer at a time
        "chunk_size": ["1000"],
    }


# --- secrets before messages are shortened ---------------------------------------------


@pytest.mark.parametrize("before", [480, 490, 495, 499])
def test_a_secret_at_the_cut_is_scrubbed_before_the_message_is_cut(before: int) -> None:
    said = "x" * before + TOKEN + " and more" * 20
    error = classify_status(503, said.encode(), {}, V1, [TOKEN])
    assert TOKEN[:4] not in str(error) and "Very" not in str(error) and "*" in str(error)
    reason = server_message(said.encode(), secrets=[TOKEN])
    assert TOKEN[:4] not in reason


def test_a_secret_holding_spaces_is_scrubbed_before_they_are_collapsed() -> None:
    secret = "correct  horse\tbattery  staple"
    error = classify_status(401, f'{{"error": "bad password {secret}"}}'.encode(), {}, V1, [secret])
    assert "horse" not in str(error) and "battery" not in str(error)
    bad = classify_status(400, f"unable to parse {secret}".encode(), {}, V1, [secret])
    assert isinstance(bad, BadPointsError) and "horse" not in bad.reason


def test_a_transport_error_is_scrubbed_before_it_is_cut() -> None:
    exc = ProtocolError("y" * 470 + f"Authorization: Bearer {TOKEN}", ConnectionResetError())
    error = transport_error(exc, V1, [TOKEN])
    assert type(error) is TransientWriteError and TOKEN[:4] not in str(error)


@pytest.mark.parametrize(
    "make",
    [
        lambda url, token: V3Writer(
            TargetConfig(url=url, influxdb=InfluxDBSettings(api="v3", database="d", token=token))
        ),
        lambda url, token: V2Writer(
            TargetConfig(
                url=url, influxdb=InfluxDBSettings(api="v2", bucket="b", org="o", token=token)
            )
        ),
    ],
    ids=["v3", "v2"],
)
def test_a_header_value_the_client_refuses_is_a_scrubbed_error(stub: Any, make: Any) -> None:
    token = "tok-Very\nSecret-123=="  # a line break: urllib3 refuses the header, quoting it
    writer = make(stub.url, Secret(token))
    with pytest.raises(TargetRequestError) as caught:
        writer.write(b"m f=1i 1")
    writer.close()
    for text in (str(caught.value), repr(caught.value)):
        assert "tok-Very" not in text and "Secret-123" not in text
    assert "cannot be made" in str(caught.value) and "ValueError" in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert stub.seen == []  # nothing was sent


def test_a_ping_the_client_refuses_is_a_scrubbed_error(stub: Any) -> None:
    config = TargetConfig(
        url=stub.url,
        influxdb=InfluxDBSettings(database="d", token=Secret("tok-Very\nSecret-123==")),
    )
    with pytest.raises(TargetRequestError) as caught:
        resolve_api(config)
    assert "Secret-123" not in str(caught.value)


def test_scrub_finds_a_secret_as_an_exception_quotes_it() -> None:
    token = "tok-Very\nSecret-é"
    for shown in (repr(token), repr(f"Bearer {token}".encode()), " ".join(token.split())):
        assert "Secret" not in scrub(f"Invalid header value {shown}", [token]), shown
