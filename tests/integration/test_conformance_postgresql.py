"""The PostgreSQL kind passes the conformance kit against the dev env's PostgreSQL: each
check writes to a database of its own (tables created as points arrive), and the
catch-up check's other target to a second one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import postgresql_target
from twophase.config import TargetConfig
from twophase.testing import TargetConformance


def _database(base_staging_url: str, prefix: str) -> Iterator[TargetConfig]:
    with postgresql_target(base_staging_url, prefix) as (config, _):
        yield config


class TestPostgreSQLConformance(TargetConformance):
    @pytest.fixture
    def target(self, base_staging_url: str) -> Iterator[TargetConfig]:
        yield from _database(base_staging_url, "tp_conformance")

    @pytest.fixture
    def second_target(self, base_staging_url: str) -> Iterator[TargetConfig]:
        yield from _database(base_staging_url, "tp_conformance_other")
