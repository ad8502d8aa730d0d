"""Fixtures over the real servers started by `scripts/dev.sh test`.

Each test gets its own staging database (cloned from a template migrated once
by the real `alembic upgrade head`) and its own InfluxDB database.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devkit import InfluxServer
from devkit.ports import start_own_influx
from tests.integration.crash_driver import MEASUREMENT
from tests.integration.crash_helpers import dead_letters, run_driver
from tests.integration.deliveries import Recording, recorded
from tests.integration.fanout_helpers import Targets, proxied_targets
from tests.support import (
    OWN_INFLUX_DB,
    create_database,
    create_influx_database,
    create_migrated_database,
    drop_database,
    drop_influx_database,
    influx_rows,
    require_env,
    staging_config_for,
    two_phase,
    unique,
)
from twophase.config import InfluxDBSettings, StagingConfig, TargetConfig
from twophase.protocol.commit.runtime import TwoPhase


@pytest.fixture(scope="session")
def base_staging_url() -> str:
    return require_env("TWOPHASE_STAGING_URL")


@pytest.fixture(scope="session")
def template_db(base_staging_url: str) -> Iterator[str]:
    name = unique("twophase_tpl")
    create_migrated_database(base_staging_url, name)
    yield name
    drop_database(base_staging_url, name)


@pytest.fixture
def staging_url(base_staging_url: str, template_db: str) -> Iterator[str]:
    name = unique("twophase_t")
    yield create_database(base_staging_url, name, template=template_db)
    drop_database(base_staging_url, name)


@pytest.fixture
def staging(staging_url: str, request: pytest.FixtureRequest) -> StagingConfig:
    """The test's staging store; ``@pytest.mark.lanes(n)`` sets promote_connections (a
    test of the staged layout or of the global send order pins one lane),
    ``@pytest.mark.compression(c)`` the compression of staged chunks."""
    overrides: dict[str, object] = {}
    for marker, option in (("lanes", "promote_connections"), ("compression", "compression")):
        found = request.node.get_closest_marker(marker)
        if found:
            overrides[option] = found.args[0]
    return staging_config_for(staging_url, **overrides)


@pytest.fixture(scope="session")
def influx_url() -> str:
    return require_env("TWOPHASE_TARGET_URL")


@pytest.fixture
def influx(influx_url: str) -> Iterator[TargetConfig]:
    name = unique("tp")
    create_influx_database(influx_url, name)
    yield TargetConfig(
        url=influx_url,
        retry_deadline_s=20,
        retry_initial_s=0.05,
        retry_max_s=1,
        influxdb=InfluxDBSettings(api="v1", database=name),
    )
    drop_influx_database(influx_url, name)


@pytest.fixture
def tp(staging: StagingConfig, influx: TargetConfig) -> Iterator[TwoPhase]:
    with two_phase(staging, influx) as parts:
        yield parts


@pytest.fixture
def own_influx(tmp_path: Path) -> Iterator[InfluxServer]:
    """An InfluxDB server of the test's own (database ``OWN_INFLUX_DB``), for tests that
    stop and start it."""
    server = start_own_influx(tmp_path, OWN_INFLUX_DB)
    yield server
    server.stop()


@pytest.fixture
def recording(influx: TargetConfig) -> Iterator[Recording]:
    """The ``influx`` target behind a fault proxy that records every write request."""
    with recorded(influx) as each:
        yield each


@pytest.fixture(scope="module")
def crash_free(
    base_staging_url: str,
    template_db: str,
    influx_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    """One crash-free run: what every crashed run must end up equal to."""
    name, db = unique("tp_clean"), unique("clean")
    url = create_database(base_staging_url, name, template=template_db)
    create_influx_database(influx_url, db)
    influx = TargetConfig(url=influx_url, influxdb=InfluxDBSettings(api="v1", database=db))
    done = run_driver(url, influx, tmp_path_factory.mktemp("clean") / "log", "clean")
    assert done.returncode == 0, done.stderr
    yield {"rows": influx_rows(influx, MEASUREMENT), "dead": dead_letters(url)}
    drop_database(base_staging_url, name)
    drop_influx_database(influx_url, db)


@pytest.fixture
def two(influx_url: str) -> Iterator[Targets]:
    """Targets a and b of the real InfluxDB, each behind a fault proxy of its own."""
    with proxied_targets(influx_url) as targets:
        yield targets
