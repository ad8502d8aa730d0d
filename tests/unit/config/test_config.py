"""Configuration: parsed once, validated eagerly, errors name the option, secrets never shown."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from scripts import docs_reference
from twophase.config import Secret, load_config, load_target_config, parse_duration
from twophase.errors import ConfigError

BASE = {
    "TWOPHASE_STAGING_URL": "postgresql+psycopg://tp:pg-s3cret@db.example:5432/tp",
    "TWOPHASE_TARGET_URL": "https://influx.example:8086",
    "TWOPHASE_INFLUX_API": "v1",
    "TWOPHASE_INFLUX_DB": "metrics",
    "TWOPHASE_TARGET_PASSWORD": "influx-s3cret",
}


def test_loads_from_environment() -> None:
    config = load_config(env=BASE)
    assert config.target.influxdb.database == "metrics"
    assert config.target.influxdb.api == "v1"
    assert config.staging.display_url == "postgresql+psycopg://tp:***@db.example:5432/tp"
    assert config.staging.psycopg_conninfo().startswith("postgresql://tp:pg-s3cret@")


def test_explicit_arguments_win_over_environment() -> None:
    config = load_config(env=BASE, influx_db="other", target_batch_points=10)
    assert (config.target.influxdb.database, config.target.batch_points) == ("other", 10)


def test_secrets_never_in_repr_str_or_logs(caplog: pytest.LogCaptureFixture) -> None:
    config = load_config(env=BASE)
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("t").info("config: %s %r", config, config)
    for text in (repr(config), str(config), caplog.text):
        assert "pg-s3cret" not in text
        assert "influx-s3cret" not in text
    assert config.target.password is not None
    assert config.target.password.reveal() == "influx-s3cret"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"TWOPHASE_STAGING_URL": None}, "TWOPHASE_STAGING_URL"),
        ({"TWOPHASE_STAGING_URL": "mysql://x@y/z"}, "TWOPHASE_STAGING_URL"),
        ({"TWOPHASE_STAGING_URL": "not a url"}, "TWOPHASE_STAGING_URL"),
        ({"TWOPHASE_TARGET_URL": None}, "TWOPHASE_TARGET_URL"),
        ({"TWOPHASE_TARGET_URL": "ftp//x"}, "TWOPHASE_TARGET_URL"),
        ({"TWOPHASE_TARGET_URL": "postgresql://u:secret@h/db"}, "TWOPHASE_TARGET_URL"),
        ({"TWOPHASE_INFLUX_API": "v9"}, "TWOPHASE_INFLUX_API"),
        ({"TWOPHASE_INFLUX_DB": None}, "TWOPHASE_INFLUX_DB"),
        ({"TWOPHASE_TARGET_BATCH_POINTS": "many"}, "TWOPHASE_TARGET_BATCH_POINTS"),
        ({"TWOPHASE_TARGET_BATCH_POINTS": "0"}, "TWOPHASE_TARGET_BATCH_POINTS"),
        ({"TWOPHASE_TARGET_RETRY_DEADLINE": "soon"}, "TWOPHASE_TARGET_RETRY_DEADLINE"),
        ({"TWOPHASE_RETENTION": "7 fortnights"}, "TWOPHASE_RETENTION"),
        ({"TWOPHASE_INFLUX_API": "v2"}, "TWOPHASE_INFLUX_BUCKET"),
        ({"TWOPHASE_INFLUX_API": "v2", "TWOPHASE_INFLUX_BUCKET": "b"}, "TWOPHASE_INFLUX_ORG"),
    ],
)
def test_wrong_or_missing_value_names_the_variable(
    change: dict[str, str | None], named: str
) -> None:
    env = {k: v for k, v in {**BASE, **change}.items() if v is not None}
    with pytest.raises(ConfigError) as info:
        load_config(env=env)
    assert info.value.option == named
    assert str(info.value).startswith(named)
    assert "s3cret" not in str(info.value)


def test_explicit_option_errors_name_the_option() -> None:
    with pytest.raises(ConfigError, match=r"^influx_api:"):
        load_config(env=BASE, influx_api="v4")
    with pytest.raises(ConfigError, match=r"^influx_databse: unknown option"):
        load_config(env=BASE, influx_databse="typo")


def test_password_in_influx_url_is_refused_without_echoing_it() -> None:
    with pytest.raises(ConfigError) as info:
        load_target_config(env={**BASE, "TWOPHASE_TARGET_URL": "http://u:hunter2@h:8086"})
    assert "hunter2" not in str(info.value)


def test_secret_from_file(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("tok-from-file\n")
    env = {
        **BASE,
        "TWOPHASE_INFLUX_API": "v2",
        "TWOPHASE_INFLUX_ORG": "o",
        "TWOPHASE_INFLUX_BUCKET": "b",
        "TWOPHASE_INFLUX_TOKEN_FILE": str(token),
    }
    config = load_config(env=env)
    assert config.target.influxdb.token == Secret("tok-from-file")
    with pytest.raises(ConfigError, match="TWOPHASE_INFLUX_TOKEN_FILE"):
        load_config(env={**env, "TWOPHASE_INFLUX_TOKEN_FILE": str(tmp_path / "missing")})


def test_auto_api_is_left_for_the_server_to_answer() -> None:
    env = {k: v for k, v in BASE.items() if k != "TWOPHASE_INFLUX_API"}
    assert load_config(env=env).target.influxdb.api == "auto"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("45s", 45),
        ("30m", 1800),
        ("12h", 43200),
        ("7d", 604800),
        ("2w", 1209600),
        ("90", 90),
        (3, 3.0),
    ],
)
def test_durations(text: str | int, seconds: float) -> None:
    assert parse_duration(text, "x") == seconds


def test_bad_duration_names_option() -> None:
    with pytest.raises(ConfigError, match=r"^--retention: '7x' is not a duration"):
        parse_duration("7x", "--retention")


# --- secrets read from files -----------------------------------------------------------

V2 = {
    **BASE,
    "TWOPHASE_INFLUX_API": "v2",
    "TWOPHASE_INFLUX_ORG": "o",
    "TWOPHASE_INFLUX_BUCKET": "b",
}


@pytest.mark.parametrize(
    "content", ["", "\n", "\r\n", "  \n"], ids=["empty", "lf", "crlf", "blank"]
)
def test_an_empty_secret_file_is_refused_naming_its_variable(tmp_path: Path, content: str) -> None:
    token = tmp_path / "token"
    token.write_bytes(content.encode())
    with pytest.raises(ConfigError) as refused:
        load_config(env={**V2, "TWOPHASE_INFLUX_TOKEN_FILE": str(token)})
    assert refused.value.option == "TWOPHASE_INFLUX_TOKEN_FILE"
    assert "empty" in refused.value.problem


@pytest.mark.parametrize(
    ("variable", "content"),
    [
        ("TWOPHASE_INFLUX_TOKEN_FILE", "tok-s3cret\nsecond-s3cret-line\n"),
        ("TWOPHASE_INFLUX_TOKEN_FILE", "tok-s3cret\r\nx"),
        ("TWOPHASE_TARGET_PASSWORD_FILE", "pw\x00-s3cret"),
        ("TWOPHASE_STAGING_URL_FILE", "postgresql+psycopg://u:s3cret@h/db\nx"),
    ],
)
def test_a_secret_file_with_a_control_character_is_refused_without_its_value(
    tmp_path: Path, variable: str, content: str
) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(content.encode())
    env = {k: v for k, v in V2.items() if k != variable.removesuffix("_FILE")}
    with pytest.raises(ConfigError) as refused:
        load_config(env={**env, variable: str(secret)})
    assert refused.value.option == variable
    assert "control character" in refused.value.problem
    assert "s3cret" not in str(refused.value) and "second" not in str(refused.value)


def test_a_target_s_secret_file_is_checked_the_same(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    env = {**BASE, "TWOPHASE_TARGETS": "a=https://h1:8086,b=https://h2:8086"}
    del env["TWOPHASE_TARGET_URL"]
    with pytest.raises(ConfigError) as refused:
        load_config(env={**env, "TWOPHASE_TARGET_B_TARGET_PASSWORD_FILE": str(empty)})
    assert refused.value.option == "TWOPHASE_TARGET_B_TARGET_PASSWORD_FILE"


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("TWOPHASE_TARGET_PASSWORD", "pa-s3cret\nx"),
        ("TWOPHASE_INFLUX_TOKEN", "tok-s3cret\r"),
        ("TWOPHASE_STAGING_URL", "postgresql+psycopg://u:s3cret@h/db\n"),
    ],
)
def test_a_secret_with_a_line_break_is_refused_from_anywhere(option: str, value: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(env={**BASE, option: value})
    assert refused.value.option == option
    assert "s3cret" not in str(refused.value)
    name = option.removeprefix("TWOPHASE_").lower()
    with pytest.raises(ConfigError, match=f"^{name}: holds a control character"):
        load_config(env=BASE, **{name: value})


# --- credentials over plain http --------------------------------------------------------

PLAIN = {**BASE, "TWOPHASE_TARGET_URL": "http://influx.example:8086"}


@pytest.mark.parametrize(
    "credentials",
    [
        {"TWOPHASE_TARGET_PASSWORD": "influx-s3cret"},
        {"TWOPHASE_TARGET_PASSWORD": None, "TWOPHASE_INFLUX_TOKEN": "tok-s3cret"},
    ],
    ids=["password", "token"],
)
def test_credentials_over_plain_http_are_refused(credentials: dict[str, str | None]) -> None:
    env = {k: v for k, v in {**PLAIN, **credentials}.items() if v is not None}
    with pytest.raises(ConfigError) as refused:
        load_config(env=env)
    assert refused.value.option == "TWOPHASE_TARGET_URL"
    problem = refused.value.problem
    assert "TWOPHASE_ALLOW_PLAINTEXT_CREDENTIALS" in problem
    assert "http://influx.example:8086" in problem
    assert "s3cret" not in str(refused.value)


@pytest.mark.parametrize(
    "explicit",
    [
        {"allow_plaintext_credentials": True},
        {"allow_plaintext_credentials": "true"},
        {"allow_plaintext_credentials": "YES"},
    ],
)
def test_allow_plaintext_credentials_lets_them_through(explicit: dict[str, object]) -> None:
    assert load_config(env=PLAIN, **explicit).target.allow_plaintext_credentials is True
    env = {**PLAIN, "TWOPHASE_ALLOW_PLAINTEXT_CREDENTIALS": "1"}
    assert load_config(env=env).target.allow_plaintext_credentials is True


def test_allow_plaintext_credentials_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "twophase.toml"
    path.write_text("allow_plaintext_credentials = true\n")
    config = load_config(env={**PLAIN, "TWOPHASE_CONFIG": str(path)})
    assert config.target.allow_plaintext_credentials is True


def test_allow_plaintext_credentials_must_be_a_boolean() -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(env={**PLAIN, "TWOPHASE_ALLOW_PLAINTEXT_CREDENTIALS": "maybe"})
    assert refused.value.option == "TWOPHASE_ALLOW_PLAINTEXT_CREDENTIALS"


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:18086",
        "http://127.3.4.5:8086",
        "http://[::1]:8086",
        "http://localhost:8086",
        "http://LocalHost.:8086",
        "https://influx.example:8086",
    ],
)
def test_loopback_and_https_take_credentials(url: str) -> None:
    config = load_config(env={**BASE, "TWOPHASE_TARGET_URL": url, "TWOPHASE_INFLUX_TOKEN": "t0k"})
    assert config.target.password is not None and config.target.influxdb.token is not None


def test_plain_http_without_credentials_is_fine() -> None:
    env = {k: v for k, v in PLAIN.items() if k != "TWOPHASE_TARGET_PASSWORD"}
    config = load_config(env={**env, "TWOPHASE_TARGET_USERNAME": "reader"})
    assert config.target.url == "http://influx.example:8086"


def test_a_plain_http_target_is_refused_naming_it_and_its_own_setting() -> None:
    env = {k: v for k, v in BASE.items() if k != "TWOPHASE_TARGET_URL"}
    env["TWOPHASE_TARGETS"] = "a=https://influx-a:8086,b=http://influx-b:8086"
    with pytest.raises(ConfigError) as refused:
        load_config(env=env)
    assert refused.value.option == "TWOPHASE_TARGETS"
    problem = refused.value.problem
    assert "target 'b' (http://influx-b:8086)" in problem
    assert "TWOPHASE_TARGET_B_ALLOW_PLAINTEXT_CREDENTIALS" in problem
    assert "influx-s3cret" not in str(refused.value)
    allowed = load_config(env={**env, "TWOPHASE_TARGET_B_ALLOW_PLAINTEXT_CREDENTIALS": "true"})
    a, b = allowed.target.targets
    assert (a.config.allow_plaintext_credentials, b.config.allow_plaintext_credentials) == (
        False,
        True,
    )


def test_allow_plaintext_credentials_is_in_the_settings_reference() -> None:
    row = "| `allow_plaintext_credentials` | `TWOPHASE_ALLOW_PLAINTEXT_CREDENTIALS` | boolean |"
    assert f"{row} `false` |" in docs_reference.settings()


def test_both_metrics_endpoints_listen_on_loopback_unless_told(tmp_path: Path) -> None:
    from twophase.config import PER_TARGET, load_exporter_config

    exporter = load_exporter_config(env={})
    assert (exporter.host, exporter.port, exporter.endpoint.scheme) == ("127.0.0.1", 9464, "http")
    influx = load_target_config(env={**BASE, "TWOPHASE_METRICS_PORT": "9465"})
    endpoint = influx.metrics_endpoint
    assert endpoint is not None and (endpoint.host, endpoint.port) == ("127.0.0.1", 9465)
    assert load_target_config(env=BASE).metrics_endpoint is None  # no port: no endpoint
    assert not {o for o in PER_TARGET if o.startswith(("metrics_", "exporter_"))}
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("x")
    key.write_text("x")
    given = {
        "TWOPHASE_EXPORTER_HOST": "0.0.0.0",
        "TWOPHASE_EXPORTER_TLS_CERT": str(cert),
        "TWOPHASE_EXPORTER_TLS_KEY": str(key),
        "TWOPHASE_EXPORTER_CACHE": "2s",
    }
    exporter = load_exporter_config(env=given)
    assert (exporter.host, exporter.endpoint.scheme, exporter.cache_s) == ("0.0.0.0", "https", 2)


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"metrics_tls_cert": "c.pem"}, "TWOPHASE_METRICS_TLS_KEY: is required"),
        ({"metrics_tls_client_ca": "ca.pem"}, "TWOPHASE_METRICS_TLS_CLIENT_CA: needs"),
    ],
)
def test_an_endpoint_s_tls_files_come_together(
    tmp_path: Path, given: dict[str, str], named: str
) -> None:
    for name in given.values():
        (tmp_path / name).write_text("x")
    files = {option: str(tmp_path / name) for option, name in given.items()}
    with pytest.raises(ConfigError, match=named):
        load_target_config(env=BASE, metrics_port=9465, **files)
