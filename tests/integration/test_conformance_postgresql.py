"""The PostgreSQL kind passes the conformance kit against the dev env's PostgreSQL: each
check writes to a database of its own (tables created as points arrive), and the
catch-up check's other target to a second one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import create_database, drop_database, unique
from twophase.config import InfluxConfig, Secret
from twophase.config.urls import DbUrl
from twophase.testing import TargetConformance


def _database(base_staging_url: str, prefix: str) -> Iterator[InfluxConfig]:
    name = unique(prefix)
    create_database(base_staging_url, name)
    base = DbUrl.parse(base_staging_url)
    assert base.password is not None
    try:
        yield InfluxConfig(
            url=f"postgresql://{base.user}@{base.hosts}/{name}",
            password=Secret(base.password),
            create_tables=True,
            timeout_s=5,
            retry_deadline_s=20,
            retry_initial_s=0.05,
            retry_max_s=1,
        )
    finally:
        drop_database(base_staging_url, name)


class TestPostgreSQLConformance(TargetConformance):
    @pytest.fixture
    def target(self, base_staging_url: str) -> Iterator[InfluxConfig]:
        yield from _database(base_staging_url, "tp_conformance")

    @pytest.fixture
    def second_target(self, base_staging_url: str) -> Iterator[InfluxConfig]:
        yield from _database(base_staging_url, "tp_conformance_other")
