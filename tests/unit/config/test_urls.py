"""PostgreSQL URLs read without SQLAlchemy: what config, the CLI and the Spark options need."""

from __future__ import annotations

import pytest

from twophase.config import load_setting
from twophase.config.urls import BadUrl, DbUrl, has_password, mask
from twophase.errors import ConfigError
from twophase.spark.options import parse_options


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("postgresql+psycopg://tp:s3cret@db:5432/tp", "postgresql+psycopg://tp:***@db:5432/tp"),
        ("postgresql://tp@db/tp?sslmode=require", "postgresql://tp@db/tp?sslmode=require"),
        ("postgresql://u:p%40ss@h1:5432,h2:5433/db", "postgresql://u:***@h1:5432,h2:5433/db"),
        ("postgresql:///tp?host=/run/pg", "postgresql:///tp?host=/run/pg"),
        ("http://u:hunter2@h:8086", "http://u:***@h:8086"),
    ],
)
def test_the_password_is_masked_and_the_rest_kept(url: str, masked: str) -> None:
    assert mask(url) == masked
    assert has_password(url) == ("***" in masked)


def test_psycopg_gets_the_url_with_its_password_and_without_the_driver() -> None:
    url = DbUrl.parse("postgresql+psycopg://u:p%40ss@h1:5432,h2:5433/db?x=1")
    assert url.password == "p@ss"
    assert url.render(scheme="postgresql") == "postgresql://u:p%40ss@h1:5432,h2:5433/db?x=1"


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("not a url", "is not a database URL"),
        ("mysql://x@y/z", "must be a PostgreSQL URL, not 'mysql'"),
        ("postgresql+psycopg2://x@y/z", "use the psycopg driver"),
    ],
)
def test_what_is_not_a_psycopg_url_is_refused(url: str, problem: str) -> None:
    with pytest.raises(BadUrl, match=problem):
        DbUrl.parse(url).check()


def test_an_unparseable_url_never_shows_its_password() -> None:
    assert "secret" not in mask("user:secret@host")


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        (
            "postgresql+psycopg://u@h/db?password=s3cret&sslpassword=k3y",
            "postgresql+psycopg://u@h/db?password=***&sslpassword=***",
        ),
        (
            "postgresql://h/db?sslmode=require&PASSWORD=s3cret&application_name=a",
            "postgresql://h/db?sslmode=require&PASSWORD=***&application_name=a",
        ),
        ("postgresql://h/db?sslpassword=k3y", "postgresql://h/db?sslpassword=***"),
    ],
)
def test_a_password_in_the_query_is_masked_and_counted(url: str, masked: str) -> None:
    assert mask(url) == masked
    assert has_password(url)
    assert "s3cret" not in mask(url) and "k3y" not in mask(url)


def test_a_query_without_a_password_is_kept_as_written() -> None:
    url = "postgresql+psycopg://u@h/db?sslmode=verify-full&passfile=/run/pgpass"
    assert mask(url) == url
    assert not has_password(url)


@pytest.mark.parametrize(
    ("url", "password", "masked"),
    [
        ("postgresql+psycopg://u:pa/ss@h/db", "pa/ss", "postgresql+psycopg://u:***@h/db"),
        ("postgresql://u:a/b/c@h1:5432,h2/db", "a/b/c", "postgresql://u:***@h1:5432,h2/db"),
        (
            "postgresql://u:p@ss/x@h/db?sslmode=require",
            "p@ss/x",
            "postgresql://u:***@h/db?sslmode=require",
        ),
        (
            "postgresql://u:pw@h/db?application_name=a@b",
            "pw",
            "postgresql://u:***@h/db?application_name=a@b",
        ),
    ],
)
def test_a_password_holding_a_slash_is_masked_whole(url: str, password: str, masked: str) -> None:
    parsed = DbUrl.parse(url)
    assert parsed.password == password
    assert mask(url) == masked
    assert has_password(url)


def test_psycopg_gets_a_password_holding_a_slash_encoded() -> None:
    url = DbUrl.parse("postgresql+psycopg://u:pa/ss@h:5432/db?x=1")
    assert (url.user, url.hosts, url.rest) == ("u", "h:5432", "/db?x=1")
    assert url.render(scheme="postgresql") == "postgresql://u:pa%2Fss@h:5432/db?x=1"


@pytest.mark.parametrize(
    ("query", "sent"),
    [
        ("password=Zq9%SE/cr@t", "password=Zq9%25SE%2Fcr%40t"),  # a bare % is itself
        ("sslpassword=k%2Fy&x=%zz", "sslpassword=k%2Fy&x=%zz"),  # escapes kept; not secret
        ("PASSWORD=a+b", "PASSWORD=a%2Bb"),  # libpq reads + as itself
    ],
)
def test_psycopg_gets_a_password_in_the_query_encoded(query: str, sent: str) -> None:
    """libpq refuses a bare ``%`` quoting the value, password and all."""
    url = DbUrl.parse(f"postgresql+psycopg://u@h/db?{query}")
    assert url.render(scheme="postgresql") == f"postgresql://u@h/db?{sent}"


def test_added_parameters_are_encoded_as_libpq_reads_them() -> None:
    url = DbUrl.parse("postgresql://u@h/db").with_params({"sslrootcert": "/my certs/ca+1.pem"})
    assert url.render() == "postgresql://u@h/db?sslrootcert=%2Fmy%20certs%2Fca%2B1.pem"


def test_the_hosts_end_at_the_query_when_there_is_no_path() -> None:
    url = DbUrl.parse("postgresql://u@h:5432?dbname=tp&host=/run/pg")
    assert url.hosts == "h:5432"
    assert url.params() == {"dbname": "tp", "host": "/run/pg"}


def test_a_spark_option_with_a_password_in_the_query_is_refused() -> None:
    for query in ("password=s3cret", "sslmode=require&sslpassword=s3cret"):
        options = {
            "sink_id": "s",
            "measurement": "m",
            "staging_url": f"postgresql+psycopg://u@h/db?{query}",
        }
        with pytest.raises(ConfigError) as refused:
            parse_options(options)
        assert refused.value.option == "staging_url"
        assert "must not contain a password" in refused.value.problem
        assert "s3cret" not in str(refused.value)


@pytest.mark.parametrize(
    "url",
    ["http://influx.example:8086/?p=s3cret", "https://influx.example:8086?u=w&token=s3cret"],
)
def test_an_influx_url_with_a_secret_in_the_query_is_refused_without_it(url: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_setting("target_url", {"TWOPHASE_TARGET_URL": url})
    assert refused.value.option == "TWOPHASE_TARGET_URL"
    assert "TWOPHASE_TARGET_PASSWORD" in refused.value.problem
    assert "s3cret" not in str(refused.value)
