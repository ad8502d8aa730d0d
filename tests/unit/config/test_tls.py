"""TLS settings to client parameters, and TLS failure messages to the setting to fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from twophase.config import load_staging_config, load_target_config
from twophase.config.tls import influx_tls_error, staging_tls_error
from twophase.errors import ConfigError
from twophase.influx.http import tls_of

URL = "postgresql+psycopg://tp:pg-s3cret@h1:5432,h2:5433/tp?target_session_attrs=read-write"
INFLUX = {"TWOPHASE_TARGET_URL": "https://influx.example:8086", "TWOPHASE_INFLUX_DB": "m"}


@pytest.fixture
def pem(tmp_path: Path) -> Path:
    path = tmp_path / "ca.pem"
    path.write_text("-----BEGIN CERTIFICATE-----\n")
    return path


def test_a_staging_ca_adds_libpq_parameters_and_verify_full(pem: Path) -> None:
    env = {
        "TWOPHASE_STAGING_URL": URL,
        "TWOPHASE_STAGING_TLS_CA": str(pem),
        "TWOPHASE_STAGING_TLS_CERT": str(pem),
        "TWOPHASE_STAGING_TLS_KEY": str(pem),
    }
    config = load_staging_config(env=env)
    for conninfo in (config.psycopg_conninfo(), config.sqlalchemy_url()):
        assert "h1:5432,h2:5433" in conninfo
        assert "target_session_attrs=read-write" in conninfo
        assert "sslmode=verify-full" in conninfo
        for name in ("sslrootcert", "sslcert", "sslkey"):
            assert f"{name}=" in conninfo
    assert config.sqlalchemy_url().startswith("postgresql+psycopg://")


def test_an_sslmode_in_the_url_is_kept(pem: Path) -> None:
    env = {"TWOPHASE_STAGING_URL": URL + "&sslmode=require", "TWOPHASE_STAGING_TLS_CA": str(pem)}
    conninfo = load_staging_config(env=env).psycopg_conninfo()
    assert "sslmode=require" in conninfo and "verify-full" not in conninfo


def test_no_tls_settings_leave_a_loopback_url_alone() -> None:
    # Other hosts get verified TLS: tests/unit/config/test_sslmode.py.
    url = URL.replace("h1:5432,h2:5433", "127.0.0.1:5432,localhost:5433")
    conninfo = load_staging_config(env={"TWOPHASE_STAGING_URL": url}).psycopg_conninfo()
    assert "ssl" not in conninfo


def test_a_missing_file_is_refused_naming_the_variable(tmp_path: Path) -> None:
    env = {"TWOPHASE_STAGING_URL": URL, "TWOPHASE_STAGING_TLS_CA": str(tmp_path / "none.pem")}
    with pytest.raises(ConfigError) as caught:
        load_staging_config(env=env)
    assert caught.value.option == "TWOPHASE_STAGING_TLS_CA"


def test_a_client_certificate_needs_its_key(pem: Path) -> None:
    env = {**INFLUX, "TWOPHASE_TARGET_TLS_CERT": str(pem)}
    with pytest.raises(ConfigError) as caught:
        load_target_config(env=env)
    assert caught.value.option == "TWOPHASE_TARGET_TLS_KEY"


def test_influx_tls_files_become_urllib3_arguments(pem: Path) -> None:
    config = load_target_config(env={**INFLUX, "TWOPHASE_TARGET_TLS_CA": str(pem)})
    assert tls_of(config)["ca_certs"] == str(pem)
    assert "cert_file" not in tls_of(config)


@pytest.mark.parametrize(
    ("message", "option"),
    [
        (
            'server certificate for "localhost" does not match host name "127.0.0.2"',
            "TWOPHASE_STAGING_URL",
        ),
        ("SSL error: certificate verify failed", "TWOPHASE_STAGING_TLS_CA"),
        (
            "connection failed: FATAL:  connection requires a valid client certificate",
            "TWOPHASE_STAGING_TLS_CERT",
        ),
        ("SSL error: tlsv1 alert unknown ca", "TWOPHASE_STAGING_TLS_CERT"),
        ("server does not support SSL, but SSL was required", "TWOPHASE_STAGING_URL"),
    ],
)
def test_libpq_tls_messages_name_the_setting(message: str, option: str) -> None:
    error = staging_tls_error(message)
    assert error is not None and error.option == option


@pytest.mark.parametrize(
    ("message", "option"),
    [
        (
            "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get local "
            "issuer certificate (_ssl.c:1006)",
            "TWOPHASE_TARGET_TLS_CA",
        ),
        (
            "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: Hostname mismatch, "
            "certificate is not valid for '127.0.0.2'",
            "TWOPHASE_TARGET_URL",
        ),
        ("[SSL: WRONG_VERSION_NUMBER] wrong version number", "TWOPHASE_TARGET_URL"),
    ],
)
def test_openssl_messages_name_the_influx_setting(message: str, option: str) -> None:
    error = influx_tls_error(message)
    assert error is not None and error.option == option


def test_other_failures_are_not_tls_errors() -> None:
    assert staging_tls_error("connection refused") is None
    assert staging_tls_error('password authentication failed for user "tp"') is None
    assert influx_tls_error("Connection refused") is None
