"""The sink's ``log_format`` option: checked on the driver, carried to the dead-letter
sink, refused by name when it is not a format."""

from __future__ import annotations

import pytest

from twophase.errors import ConfigError
from twophase.spark.options import parse_options

OPTIONS = {"sink_id": "dash", "measurement": "m", "dead_letter_sink": "dash_bad"}


@pytest.fixture(autouse=True)
def environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TWOPHASE_STAGING_URL", "postgresql+psycopg://u@localhost/db")
    monkeypatch.setenv("TWOPHASE_TARGET_URL", "http://localhost:8086")


def test_the_format_is_read_in_any_case_and_kept_by_the_dead_letter_sink() -> None:
    sink = parse_options(OPTIONS | {"LOG_FORMAT": " JSON "})
    assert sink.log_format == "json"
    assert sink.dead_letters().log_format == "json"


def test_without_the_option_the_sink_sets_up_no_logging() -> None:
    assert parse_options(OPTIONS).log_format is None


def test_an_unknown_format_is_refused_naming_the_option() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_options(OPTIONS | {"log_format": "xml"})
    assert refused.value.option == "log_format"
    assert "'xml' is not one of text, json" in str(refused.value)
