"""The data source's names: ``format("twophase")``, and its former name
``format("twophase-influx")``, which is the same sink and logs one warning per process
that it goes."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from twophase.errors import ConfigError
from twophase.spark import source
from twophase.spark.source import TwoPhaseDataSource, TwoPhaseInfluxDataSource, register

SCHEMA = StructType([StructField("k", StringType()), StructField("v", LongType())])
# Servers named but never reached: a stream writer only parses and checks its options.
OPTIONS = {
    "sink_id": "s",
    "measurement": "m",
    "tags": "k",
    "staging_url": "postgresql+psycopg://u@localhost/db",
    "target_url": "http://localhost:8086",
}
FORMER_WARNING = (
    "format('twophase-influx') is deprecated: use format('twophase'), the same sink; "
    "'twophase-influx' goes in twophase 0.12.0"
)


class Registrations:
    """``spark.dataSource`` of a session: what ``register`` hands to Spark."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.classes: list[type[Any]] = []

    def register(self, data_source: type[Any]) -> None:
        self.names.append(data_source.name())  # the key Spark finds the source by
        self.classes.append(data_source)


class Session:
    def __init__(self) -> None:
        self.dataSource = Registrations()


@pytest.fixture(autouse=True)
def fresh_process() -> Iterator[None]:
    """Each test starts as a process that has not warned yet."""
    source._warn_former_format.cache_clear()
    yield
    source._warn_former_format.cache_clear()


def former_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]


def test_register_makes_both_names_available() -> None:
    spark = Session()
    register(spark)
    assert spark.dataSource.names == ["twophase", "twophase-influx"]
    assert spark.dataSource.classes == [TwoPhaseDataSource, TwoPhaseInfluxDataSource]


def test_the_former_name_is_the_same_sink() -> None:
    current = TwoPhaseDataSource(dict(OPTIONS)).streamWriter(SCHEMA, False)
    former = TwoPhaseInfluxDataSource(dict(OPTIONS)).streamWriter(SCHEMA, False)
    assert type(former) is type(current) and former.sink == current.sink


def test_the_current_name_warns_of_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="twophase")
    TwoPhaseDataSource(dict(OPTIONS)).streamWriter(SCHEMA, False)
    assert former_warnings(caplog) == []


def test_the_former_name_warns_once_per_process(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="twophase")
    for _ in range(3):  # a Python worker plans every micro-batch
        TwoPhaseInfluxDataSource(dict(OPTIONS)).streamWriter(SCHEMA, False)
    assert former_warnings(caplog) == [FORMER_WARNING]


def test_the_former_name_checks_its_options_as_the_current_one_does() -> None:
    with pytest.raises(ConfigError, match="tag: unknown option of the twophase sink"):
        TwoPhaseInfluxDataSource({**OPTIONS, "tag": "k"}).streamWriter(SCHEMA, False)


@pytest.mark.parametrize("data_source", [TwoPhaseDataSource, TwoPhaseInfluxDataSource])
def test_a_batch_write_is_refused_naming_the_format_used(data_source: type[Any]) -> None:
    with pytest.raises(ConfigError, match=f"^format: {data_source.name()} is a streaming sink"):
        data_source(dict(OPTIONS)).writer(SCHEMA, False)


# What a Python worker imports to unpickle the sink's writer or the split UDF, before it
# runs the one step it is there for: Spark starts such workers for planning, for every
# staging task and for the commit, and each pays these imports before its first batch.
_STEP_IMPORTS = {
    # planning and committing workers stage nothing; executors commit nothing
    "twophase.spark.source": ("psycopg", "twophase.protocol", "twophase.store"),
    # most tasks split off no row: they open no pool
    "twophase.spark.dead_letter_split": ("psycopg", "twophase.protocol", "twophase.store"),
}


@pytest.mark.parametrize("module", sorted(_STEP_IMPORTS))
def test_unpickling_the_sink_imports_no_step_s_code(module: str) -> None:
    """The staging and committing code is imported by the step that runs it (``write``,
    ``commit``, a task with bad rows), not by every worker that unpickles the sink."""
    import subprocess
    import sys

    probe = (
        f"import sys, {module}; "
        f"print(' '.join(sorted(m for m in sys.modules if m.startswith("
        f"{_STEP_IMPORTS[module]!r}))))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split() == []
