"""The staging store's sslmode: verified TLS by default to a host that is not loopback,
a weaker mode written for one honoured and warned of once, loopback and sockets as
libpq leaves them."""

from __future__ import annotations

import logging
from pathlib import Path
from urllib.parse import parse_qsl

import pytest

from twophase.config import load_staging_config, sslmode
from twophase.config.urls import DbUrl

BUNDLE = "bundle.pem"  # the system's roots, as the tests' SSL_CERT_FILE names them
SECRET = "pg-s3cret"


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No libpq variable, a home without ~/.postgresql/root.crt, a known system bundle,
    and no URL warned of yet."""
    for name in ("PGSSLMODE", "PGSSLROOTCERT", "PGHOST", "PGHOSTADDR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / BUNDLE).write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / BUNDLE))
    monkeypatch.setattr(sslmode, "_warned", set())
    return tmp_path


def added(url: str, tls_ca: str | None = None, **env: str) -> dict[str, str]:
    parsed = DbUrl.parse(url)
    found = sslmode.tls_params(parsed.hosts, parsed.params(), tls_ca, env)
    if "sslrootcert" in found:  # the bundle's name, not the test's folder
        found["sslrootcert"] = Path(found["sslrootcert"]).name
    return found


VERIFIED = {"sslmode": "verify-full", "sslrootcert": BUNDLE}
LOCAL = [
    "postgresql://u@127.0.0.1:5432/db",
    "postgresql://u@127.9.8.7/db",
    "postgresql://u@localhost/db",
    "postgresql://u@LOCALHOST.:5432/db",
    "postgresql://u@[::1]:5432/db",
    "postgresql://u@[::ffff:127.0.0.1]/db",
    "postgresql://u@localhost,127.0.0.2:5433/db",
    "postgresql:///db",  # libpq's default socket
    "postgresql://%2Frun%2Fpostgresql/db",
    "postgresql:///db?host=/run/postgresql",
    "postgresql://db.example/db?host=/run/postgresql",  # the query's host wins
    "postgresql:///db?host=@abstract",
]
REMOTE = [
    "postgresql://u@db.example:5432/db",
    "postgresql://u@10.0.0.5/db",
    "postgresql://u@192.0.2.2:5432/db",
    "postgresql://u@[fd00::2]:5432/db",
    "postgresql://u@vm/db",  # a name is not resolved, even one that is loopback here
    "postgresql://u@localhost:5432,db.example:5432/db",
    "postgresql://u@127.0.0.1/db?host=db.example",
    "postgresql://u@db.example/db?hostaddr=127.0.0.1",  # the certificate names the host
    "postgresql:///db?hostaddr=10.0.0.5",
]


@pytest.mark.parametrize("url", LOCAL)
def test_loopback_and_sockets_keep_libpqs_default(url: str) -> None:
    assert added(url) == {}


@pytest.mark.parametrize("url", REMOTE)
def test_any_other_host_gets_verify_full_with_the_systems_roots(url: str) -> None:
    assert added(url) == VERIFIED


@pytest.mark.parametrize("url", [*LOCAL, *REMOTE])
@pytest.mark.parametrize("mode", ["disable", "prefer", "require", "verify-ca", "verify-full"])
def test_an_sslmode_written_in_the_url_is_honoured(url: str, mode: str) -> None:
    joiner = "&" if "?" in url else "?"
    found = added(f"{url}{joiner}sslmode={mode}")
    verifying = mode in ("verify-ca", "verify-full")
    assert found == ({"sslrootcert": BUNDLE} if verifying else {})


@pytest.mark.parametrize("url", [LOCAL[0], REMOTE[0]])
def test_a_ca_given_means_verify_full_on_any_host_with_that_ca(url: str) -> None:
    assert added(url, tls_ca="/etc/ca.pem") == {"sslmode": "verify-full"}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"PGSSLMODE": "require"}, {}),
        ({"PGSSLROOTCERT": "/etc/ca.pem"}, {"sslmode": "verify-full"}),
    ],
)
def test_libpqs_own_variables_count_as_chosen(env: dict[str, str], expected: object) -> None:
    assert added(REMOTE[0], **env) == expected


def test_a_ca_in_the_url_or_the_home_folder_is_kept(home: Path) -> None:
    assert added(REMOTE[0] + "?sslrootcert=/etc/ca.pem") == {"sslmode": "verify-full"}
    (home / ".postgresql").mkdir()
    (home / ".postgresql" / "root.crt").write_text("ca")
    assert added(REMOTE[0]) == {"sslmode": "verify-full"}


@pytest.mark.parametrize(("env", "expected"), [({}, {}), ({"PGHOST": "db.example"}, VERIFIED)])
def test_a_url_without_hosts_is_where_pghost_says(env: dict[str, str], expected: object) -> None:
    assert added("postgresql:///db", **env) == expected


def test_the_system_roots_are_the_bundle_python_reads(home: Path) -> None:
    assert sslmode.system_roots() == str(home / BUNDLE)


def test_without_a_bundle_libpq_is_asked_for_the_systems_roots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", "/nonexistent/bundle.pem")
    monkeypatch.setattr("ssl.get_default_verify_paths", lambda: _NoBundle())
    monkeypatch.setattr("psycopg.pq.version", lambda: 160000)
    assert sslmode.system_roots() == "system"
    monkeypatch.setattr("psycopg.pq.version", lambda: 150007)
    assert sslmode.system_roots() == "/usr/lib/ssl/cert.pem"


class _NoBundle:
    cafile = None
    openssl_cafile = "/usr/lib/ssl/cert.pem"


def conninfo_params(url: str, **settings: str) -> dict[str, str]:
    config = load_staging_config(env={}, staging_url=url, **settings)
    sqlalchemy = config.sqlalchemy_url()
    conninfo = config.psycopg_conninfo()
    assert conninfo.partition("?")[2] == sqlalchemy.partition("?")[2]  # Alembic's too
    return dict(parse_qsl(conninfo.partition("?")[2]))


def test_the_staging_config_hands_psycopg_and_alembic_the_decision(home: Path) -> None:
    url = f"postgresql+psycopg://tp:{SECRET}@h1:5432,h2:5433/tp?target_session_attrs=read-write"
    assert conninfo_params(url) == {
        "target_session_attrs": "read-write",
        "sslmode": "verify-full",
        "sslrootcert": str(home / BUNDLE),
    }
    assert conninfo_params(f"postgresql+psycopg://tp:{SECRET}@127.0.0.1/tp") == {}


@pytest.mark.parametrize("mode", ["disable", "allow", "prefer", "require", "verify-ca"])
def test_a_weaker_mode_for_a_remote_host_is_warned_of_once_without_the_password(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"postgresql+psycopg://tp:{SECRET}@db.example/tp?sslmode={mode}&sslpassword=k3y-{SECRET}"
    caplog.set_level(logging.WARNING, logger="twophase")
    for _ in range(3):
        assert conninfo_params(url)["sslmode"] == mode
    (record,) = caplog.records
    assert record.name == "twophase.config.sslmode" and record.levelno == logging.WARNING
    text = record.getMessage()
    assert f"sslmode={mode}" in text and "db.example" in text
    assert "TWOPHASE_STAGING_URL" in text and "tp:***@db.example" in text
    assert SECRET not in text


def test_each_url_is_warned_of_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="twophase")
    for host in ("db1.example", "db2.example", "db1.example"):
        conninfo_params(f"postgresql+psycopg://tp@{host}/tp?sslmode=require")
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2
    assert "db1.example" in messages[0] and "db2.example" in messages[1]


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://tp@localhost/tp?sslmode=disable",
        "postgresql+psycopg://tp@db.example/tp?sslmode=verify-full",
        "postgresql+psycopg://tp@db.example/tp",
        "postgresql+psycopg:///tp?host=/run/pg&sslmode=disable",
    ],
)
def test_no_warning_for_loopback_a_socket_or_a_verified_mode(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="twophase")
    conninfo_params(url)
    assert caplog.records == []
