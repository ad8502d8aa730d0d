"""Configuration: parsed once, validated eagerly, errors name the option, secrets never shown."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from twophase.config import Secret, load_config, load_influx_config, parse_duration
from twophase.errors import ConfigError

BASE = {
    "TWOPHASE_STAGING_URL": "postgresql+psycopg://tp:pg-s3cret@db.example:5432/tp",
    "TWOPHASE_INFLUX_URL": "http://influx.example:8086",
    "TWOPHASE_INFLUX_API": "v1",
    "TWOPHASE_INFLUX_DB": "metrics",
    "TWOPHASE_INFLUX_PASSWORD": "influx-s3cret",
}


def test_loads_from_environment() -> None:
    config = load_config(env=BASE)
    assert config.influx.database == "metrics"
    assert config.influx.api == "v1"
    assert config.staging.display_url == "postgresql+psycopg://tp:***@db.example:5432/tp"
    assert config.staging.psycopg_conninfo().startswith("postgresql://tp:pg-s3cret@")


def test_explicit_arguments_win_over_environment() -> None:
    config = load_config(env=BASE, influx_db="other", influx_batch_points=10)
    assert (config.influx.database, config.influx.batch_points) == ("other", 10)


def test_secrets_never_in_repr_str_or_logs(caplog: pytest.LogCaptureFixture) -> None:
    config = load_config(env=BASE)
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("t").info("config: %s %r", config, config)
    for text in (repr(config), str(config), caplog.text):
        assert "pg-s3cret" not in text
        assert "influx-s3cret" not in text
    assert config.influx.password is not None
    assert config.influx.password.reveal() == "influx-s3cret"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"TWOPHASE_STAGING_URL": None}, "TWOPHASE_STAGING_URL"),
        ({"TWOPHASE_STAGING_URL": "mysql://x@y/z"}, "TWOPHASE_STAGING_URL"),
        ({"TWOPHASE_STAGING_URL": "not a url"}, "TWOPHASE_STAGING_URL"),
        ({"TWOPHASE_INFLUX_URL": None}, "TWOPHASE_INFLUX_URL"),
        ({"TWOPHASE_INFLUX_URL": "ftp://x"}, "TWOPHASE_INFLUX_URL"),
        ({"TWOPHASE_INFLUX_API": "v9"}, "TWOPHASE_INFLUX_API"),
        ({"TWOPHASE_INFLUX_DB": None}, "TWOPHASE_INFLUX_DB"),
        ({"TWOPHASE_INFLUX_BATCH_POINTS": "many"}, "TWOPHASE_INFLUX_BATCH_POINTS"),
        ({"TWOPHASE_INFLUX_BATCH_POINTS": "0"}, "TWOPHASE_INFLUX_BATCH_POINTS"),
        ({"TWOPHASE_INFLUX_RETRY_DEADLINE": "soon"}, "TWOPHASE_INFLUX_RETRY_DEADLINE"),
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
        load_influx_config(env={**BASE, "TWOPHASE_INFLUX_URL": "http://u:hunter2@h:8086"})
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
    assert config.influx.token == Secret("tok-from-file")
    with pytest.raises(ConfigError, match="TWOPHASE_INFLUX_TOKEN_FILE"):
        load_config(env={**env, "TWOPHASE_INFLUX_TOKEN_FILE": str(tmp_path / "missing")})


def test_auto_api_is_left_for_the_server_to_answer() -> None:
    env = {k: v for k, v in BASE.items() if k != "TWOPHASE_INFLUX_API"}
    assert load_config(env=env).influx.api == "auto"


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
