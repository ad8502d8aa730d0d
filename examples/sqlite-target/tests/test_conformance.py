"""The conformance kit against both kinds of this package, each on a SQLite file of its
own per check. Needs ``TWOPHASE_STAGING_URL`` naming a PostgreSQL server whose role may
create databases (the kit makes a staging store of its own there)."""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from twophase.config import TargetConfig
from twophase.targets import kind_of
from twophase.testing import TargetConformance


def sqlite_target(url: str) -> TargetConfig:
    """A target of this kind, its retries short enough for a test."""
    return TargetConfig(url=url, retry_deadline_s=20, retry_initial_s=0.05, retry_max_s=1)


class TestSqliteTarget(TargetConformance):
    scheme = "sqlite"

    @pytest.fixture
    def target(self, tmp_path: Path) -> TargetConfig:
        return sqlite_target(f"{self.scheme}://{tmp_path / 'points.db'}")

    @pytest.fixture
    def second_target(self, tmp_path: Path) -> TargetConfig:
        return sqlite_target(f"{self.scheme}://{tmp_path / 'other.db'}")

    @contextlib.contextmanager
    def unavailable(self, config: TargetConfig) -> Iterator[TargetConfig]:
        """The file locked by another connection: a store that does not answer in time."""
        holder = sqlite3.connect(urlsplit(config.url).path, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            yield dataclasses.replace(
                config, timeout_s=0.2, retry_deadline_s=1, retry_initial_s=0.05, retry_max_s=0.2
            )
        finally:
            holder.execute("ROLLBACK")
            holder.close()


class TestSqliteTransactionalTarget(TestSqliteTarget):
    """The transactional kind: an epoch in one SQLite transaction with its record."""

    scheme = "sqlitetx"

    def test_the_kind_is_transactional(self, target: TargetConfig) -> None:
        assert kind_of(target).name == "sqlitetx" and kind_of(target).transactional
