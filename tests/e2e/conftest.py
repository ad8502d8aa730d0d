"""Fixtures for the end-to-end tests: real Spark jobs, PostgreSQL and InfluxDB.

Each test gets a fresh staging database and InfluxDB database (the
integration fixtures, reused) and a folder for its job's input, checkpoint
and logs. The event files are generated once per session.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs.generate_events import generate
from tests.e2e.harness import Target, kill_leftovers
from tests.integration import conftest as integration
from twophase.config import TargetConfig

# The integration fixtures, by name: a fresh staging database (cloned from a
# migrated template) and a fresh InfluxDB database per test.
base_staging_url = integration.base_staging_url
template_db = integration.template_db
staging_url = integration.staging_url
influx_url = integration.influx_url
influx = integration.influx

FILES = 24
EVENTS_PER_FILE = 200


@pytest.fixture(scope="session")
def event_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """24 files of 200 events (one minute of event time each, about 2% malformed)."""
    return generate(
        tmp_path_factory.mktemp("events"), files=FILES, events_per_file=EVENTS_PER_FILE, seed=11
    )


@pytest.fixture
def target(staging_url: str, influx: TargetConfig) -> Target:
    return Target(staging_url, influx)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """The test's folder: input/, checkpoint/ and logs/ go under it."""
    return tmp_path


@pytest.fixture(autouse=True)
def no_leftover_jobs() -> Iterator[None]:
    """A test that fails half-way must not leave a Spark job running."""
    yield
    kill_leftovers()
