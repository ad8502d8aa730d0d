"""The configuration's names of a former version: each still works and warns, naming
what replaced it; today's names never warn. Each setting's section is the config object
that holds its field."""

from __future__ import annotations

import dataclasses
import warnings

import pytest

import twophase
import twophase.config as config
from twophase.config import (
    INFLUXDB,
    POSTGRESQL,
    SETTINGS,
    STAGING,
    TARGET,
    InfluxDBSettings,
    NamedTarget,
    PostgreSQLSettings,
    StagingConfig,
    TargetConfig,
    TwoPhaseConfig,
    load_config,
    load_target_config,
)

ENV = {
    "TWOPHASE_STAGING_URL": "postgresql+psycopg://u@h/db",
    "TWOPHASE_TARGET_URL": "http://h:8086",
    "TWOPHASE_INFLUX_API": "v1",
    "TWOPHASE_INFLUX_DB": "metrics",
}


def test_every_setting_is_a_field_of_its_sections_config() -> None:
    holders = {
        STAGING: StagingConfig,
        TARGET: TargetConfig,
        INFLUXDB: InfluxDBSettings,
        POSTGRESQL: PostgreSQLSettings,
    }
    for setting in SETTINGS:
        holder = holders.get(setting.section)
        if holder is not None:
            assert setting.attr in {f.name for f in dataclasses.fields(holder)}, setting.name


def test_a_former_influx_config_sorts_its_fields_into_sections() -> None:
    with pytest.warns(DeprecationWarning, match=r"InfluxConfig is deprecated .*: use TargetConfig"):
        made = config.InfluxConfig(
            url="http://h:8086", api="v1", database="m", schema="s", timeout_s=3.0
        )
    assert made == TargetConfig(
        url="http://h:8086",
        timeout_s=3.0,
        influxdb=InfluxDBSettings(api="v1", database="m"),
        postgresql=PostgreSQLSettings(schema="s"),
    )
    with pytest.warns(DeprecationWarning, match="InfluxConfig"):
        assert twophase.InfluxConfig(url="http://h:8086") == TargetConfig(url="http://h:8086")


def test_a_former_loader_warns_and_loads_the_same() -> None:
    with pytest.warns(DeprecationWarning, match="use load_target_config"):
        loaded = config.load_influx_config(env=ENV)
    assert loaded == load_target_config(env=ENV)
    with pytest.warns(DeprecationWarning, match="load_influx_config"):
        twophase.load_influx_config(env=ENV)


def test_former_attributes_warn_and_give_todays() -> None:
    loaded = load_config(env=ENV)
    with pytest.warns(DeprecationWarning, match=r"TwoPhaseConfig\.influx .*TwoPhaseConfig\.target"):
        assert loaded.influx is loaded.target
    (one,) = loaded.target.named_targets()
    with pytest.warns(DeprecationWarning, match=r"NamedTarget\.influx .*NamedTarget\.config"):
        assert one.influx is one.config


def test_todays_names_never_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = load_config(env=ENV)
        assert isinstance(loaded, TwoPhaseConfig)
        assert loaded.target.influxdb.database == "metrics"
        assert isinstance(loaded.target.named_targets()[0], NamedTarget)
        assert twophase.TargetConfig is TargetConfig
        assert twophase.load_target_config is load_target_config


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="NoSuchConfig"):
        _ = config.NoSuchConfig
