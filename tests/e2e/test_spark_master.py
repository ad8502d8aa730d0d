"""A driver on a Spark master that retries no failed task says so, once: a real
SparkContext on ``local[2]``, a sink's parts opened and the sink claimed twice."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from tests.e2e.harness import without_password
from twophase.config import TargetConfig
from twophase.spark import driver_commit, master_retries, parse_options, register

WARNING = (
    "Spark master local[2] retries no failed task: one failed task (staging past its "
    "deadline, a lost worker) fails the query; use local[2,4]"
)


@pytest.fixture
def local2(base_staging_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    password = make_url(base_staging_url).password
    if password:
        monkeypatch.setenv("PGPASSWORD", str(password))
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("twophase-e2e-master")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    yield session
    session.stop()


def test_a_local_master_without_task_retries_is_warned_of_once(
    local2: Any,
    staging_url: str,
    influx: TargetConfig,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert master_retries.active_master() == "local[2]"
    monkeypatch.setattr(master_retries, "_checked", threading.Event())  # as in a fresh driver
    sink = parse_options(
        {
            "sink_id": "master",
            "measurement": "m",
            "staging_url": without_password(staging_url),
            "influx_db": str(influx.influxdb.database),
            "influx_api": "v1",
            "target_url": influx.url,
        }
    )
    try:
        with caplog.at_level(logging.WARNING, logger="twophase"):
            driver_commit.claim(sink, "run-1", "query-1")  # opens the parts, then claims
            driver_commit.claim(sink, "run-2", "query-1")  # a restart's claim
            register(local2)
    finally:
        driver_commit._parts.pop(sink.settings).close()
    said = [(r.name, r.getMessage()) for r in caplog.records if "retries no" in r.getMessage()]
    assert said == [("twophase.spark", WARNING)]
