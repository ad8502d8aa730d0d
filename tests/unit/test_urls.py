"""PostgreSQL URLs read without SQLAlchemy: what config, the CLI and the Spark options need."""

from __future__ import annotations

import pytest

from twophase.config.urls import BadUrl, DbUrl, has_password, mask


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
