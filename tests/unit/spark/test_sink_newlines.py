"""The setting ``allow_newlines_in_strings``: off by default, read by the sink's point
builder, checked on the driver and documented with the other settings."""

from __future__ import annotations

import pytest

from scripts import docs_reference
from twophase.config import BY_NAME, load_setting
from twophase.errors import ConfigError
from twophase.points.builder import Rejected
from twophase.spark.options import parse_options
from twophase.spark.staging_task import items_of

OPTIONS = {"sink_id": "dash", "measurement": "m"}
VARIABLE = "TWOPHASE_ALLOW_NEWLINES_IN_STRINGS"
T0 = 1_700_000_000_000_000_000
ROWS = [
    {"note": "fine", "v": 1, "t": T0},
    {"note": "x\nadmin,host=prod cpu=99 1700000000000000000\n", "v": 2, "t": T0},
]


@pytest.fixture(autouse=True)
def environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TWOPHASE_STAGING_URL", "postgresql+psycopg://u@localhost/db")
    monkeypatch.setenv("TWOPHASE_TARGET_URL", "http://localhost:8086")
    monkeypatch.delenv(VARIABLE, raising=False)
    monkeypatch.delenv("TWOPHASE_CONFIG", raising=False)


def staged(options: dict[str, str]) -> list[str | Rejected]:
    sink = parse_options(OPTIONS | {"time": "t"} | options)
    return list(items_of(sink, ROWS))


def test_the_setting_is_off_by_default_and_in_the_settings_reference() -> None:
    assert BY_NAME["allow_newlines_in_strings"].default is False
    assert load_setting("allow_newlines_in_strings", {}) is False
    reference = docs_reference.settings()
    assert f"| `allow_newlines_in_strings` | `{VARIABLE}` | boolean | `false` |" in reference


def test_by_default_the_sink_dead_letters_a_string_with_a_raw_newline() -> None:
    assert parse_options(OPTIONS).allows_newlines() is False
    good, bad = staged({})
    assert good == f'm note="fine",v=1i {T0}'
    assert isinstance(bad, Rejected) and bad.index == 1
    assert "contains a newline" in bad.reason and "allow_newlines_in_strings" in bad.reason


@pytest.mark.parametrize("value", ["true", "TRUE", " true "])
def test_the_sink_option_allows_raw_newlines(value: str) -> None:
    good, allowed = staged({"allow_newlines_in_strings": value})
    assert good == f'm note="fine",v=1i {T0}'
    assert allowed == f'm note="{ROWS[1]["note"]}",v=2i {T0}'


def test_the_environment_allows_raw_newlines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VARIABLE, "true")
    assert parse_options(OPTIONS).allows_newlines() is True
    assert all(isinstance(item, str) for item in staged({}))
    # An explicit option wins over the environment.
    assert isinstance(staged({"allow_newlines_in_strings": "false"})[1], Rejected)


def test_a_malformed_value_is_refused_on_the_driver_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_options(OPTIONS | {"allow_newlines_in_strings": "maybe"})
    assert refused.value.option == "allow_newlines_in_strings"
    monkeypatch.setenv(VARIABLE, "sometimes")
    with pytest.raises(ConfigError) as refused:
        parse_options(OPTIONS)
    assert refused.value.option == VARIABLE
