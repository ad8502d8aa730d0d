"""target_max_backlog_bytes and target_catch_up_rate, configuration side: off by default,
negative values refused naming the variable, the rate one target's own, the byte bound
the sink's."""

from __future__ import annotations

import pytest

from twophase.config import PER_TARGET, load_config, load_target_config
from twophase.errors import ConfigError

STAGING = {"TWOPHASE_STAGING_URL": "postgresql+psycopg://tp@db.example:5432/tp"}
TWO = {
    **STAGING,
    "TWOPHASE_INFLUX_API": "v1",
    "TWOPHASE_INFLUX_DB": "metrics",
    "TWOPHASE_TARGETS": "a=http://influx-a:8086,b=https://influx-b:8086/",
}


def test_both_are_off_unless_set() -> None:
    influx = load_target_config(env=TWO)
    assert (influx.target_max_backlog_bytes, influx.target_catch_up_rate) == (0, 0)
    assert [t.config.target_catch_up_rate for t in influx.named_targets()] == [0, 0]


def test_the_rate_is_each_targets_own_and_the_byte_bound_the_sinks() -> None:
    env = {
        **TWO,
        "TWOPHASE_TARGET_MAX_BACKLOG_BYTES": "1073741824",
        "TWOPHASE_TARGET_CATCH_UP_RATE": "5000",
        "TWOPHASE_TARGET_B_TARGET_CATCH_UP_RATE": "200",
    }
    influx = load_target_config(env=env)
    assert influx.target_max_backlog_bytes == 1024**3
    rates = {t.name: t.config.target_catch_up_rate for t in influx.named_targets()}
    assert rates == {"a": 5000, "b": 200}
    assert "target_catch_up_rate" in PER_TARGET
    assert "target_max_backlog_bytes" not in PER_TARGET


@pytest.mark.parametrize(
    "var",
    [
        "TWOPHASE_TARGET_MAX_BACKLOG_BYTES",
        "TWOPHASE_TARGET_CATCH_UP_RATE",
        "TWOPHASE_TARGET_B_TARGET_CATCH_UP_RATE",
    ],
)
@pytest.mark.parametrize("value", ["-1", "lots"])
def test_a_negative_or_unreadable_value_is_refused_naming_the_variable(
    var: str, value: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env={**TWO, var: value})
    assert info.value.option == var


def test_a_target_cannot_have_a_byte_bound_of_its_own() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env={**TWO, "TWOPHASE_TARGET_B_TARGET_MAX_BACKLOG_BYTES": "5"})
    assert info.value.option == "TWOPHASE_TARGET_B_TARGET_MAX_BACKLOG_BYTES"
    assert "not a per-target setting" in info.value.problem


def test_explicit_values_as_the_spark_sink_gives_them() -> None:
    config = load_config(env=TWO, target_max_backlog_bytes="4096", target_catch_up_rate=50)
    assert config.target.target_max_backlog_bytes == 4096
    assert config.target.target_catch_up_rate == 50
    with pytest.raises(ConfigError) as info:
        load_config(env=TWO, target_catch_up_rate=-5)
    assert info.value.option == "target_catch_up_rate"
