"""Kinds of target from a package of their own, found only through their entry points:
the example SQLite kinds (``twophase.testing.example_sqlite``), packaged in
``tests/plugins`` and copied with their ``*.dist-info`` into a folder put on
``sys.path``, as an installed distribution is. A sink delivers to the
overwriting one end to end, and both pass the conformance kit: the transactional one
(``sqlitetx``) as a third-party kind that keeps its own record of delivered epochs,
keyed on the generation twophase gives it."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import shutil
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.staging import lines, stage
from tests.support import target_config
from twophase.config import TargetConfig, load_config
from twophase.errors import BadPointsError, TargetNotFoundError
from twophase.model import EpochState
from twophase.protocol.commit.runtime import TwoPhase
from twophase.targets import ENTRY_POINT_GROUP, TargetKind, kind_of, kinds, make_writer
from twophase.testing import TargetConformance, held, normalized
from twophase.testing.support import Case

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
PACKAGE = "twophase_sqlite_target"
DIST = f"{PACKAGE}-0.1.dist-info"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TargetKind]:
    """The package and its metadata in a folder of their own on ``sys.path``; the kinds
    looked up again. Taken away afterwards."""
    site = tmp_path_factory.mktemp("site")
    for folder in (PACKAGE, DIST):
        shutil.copytree(PLUGINS / folder, site / folder)
    kinds.cache_clear()
    assert "sqlite" not in kinds() and PACKAGE not in sys.modules
    sys.path.insert(0, str(site))
    kinds.cache_clear()
    try:
        yield kinds()["sqlite"]
    finally:
        sys.path.remove(str(site))
        sys.modules.pop(PACKAGE, None)
        kinds.cache_clear()


def sqlite_config(path: Path, scheme: str = "sqlite", **settings: object) -> TargetConfig:
    fast = {"retry_deadline_s": 20, "retry_initial_s": 0.05, "retry_max_s": 1}
    return target_config(f"{scheme}://{path}", **{**fast, **settings})


def test_the_kind_is_found_through_its_entry_point_only(installed: TargetKind) -> None:
    assert installed is sys.modules[PACKAGE].KIND  # loaded by the entry point's lookup
    dist = importlib.metadata.distribution("twophase-sqlite-target")
    points = [p.value for p in dist.entry_points if p.group == ENTRY_POINT_GROUP]
    assert points == [f"{PACKAGE}:KIND", f"{PACKAGE}:TX_KIND"]
    assert kind_of(TargetConfig(url="sqlite:///tmp/points.db")) is installed


def test_a_sink_delivers_to_it_end_to_end(
    installed: TargetKind, staging_url: str, tmp_path: Path
) -> None:
    """Configured as users do (``TWOPHASE_TARGETS``); a refused point is a dead letter."""
    path = tmp_path / "points.db"
    env = {"TWOPHASE_STAGING_URL": staging_url, "TWOPHASE_TARGETS": f"lite=sqlite://{path}"}
    refused = 'proto,host=z v="text" 1700000000000000001'
    with TwoPhase.open(load_config(env=env)) as tp:
        lease = tp.claim("lite-sink", "r1", "q1")
        for epoch, extra in ((0, []), (1, [refused])):
            messages = stage(tp, "lite-sink", epoch, [lines(epoch, 7), lines(epoch, 9)[7:] + extra])
            outcome = tp.committer.commit(lease, epoch, messages)
            assert outcome.state == EpochState.COMMITTED
            assert (outcome.promoted.delivered, outcome.promoted.rejected) == (9, len(extra))
    readback = installed.readback(sqlite_config(path))
    got = normalized(readback.window("proto", 0, 2**62))
    assert len(got) == 18 and len({(t, tags) for t, tags, _ in got}) == 18


def test_an_unreadable_path_is_not_found(installed: TargetKind, tmp_path: Path) -> None:
    writer = make_writer(sqlite_config(tmp_path / "missing" / "points.db"))
    with pytest.raises(TargetNotFoundError, match="unable to open"):
        writer.write(b"m v=1 1")


def test_a_refusal_names_its_line(installed: TargetKind, tmp_path: Path) -> None:
    writer = make_writer(sqlite_config(tmp_path / "points.db"))
    writer.write(b"m v=1.5 1")
    with pytest.raises(BadPointsError) as caught:
        writer.write(b'm v=2.5 2\nm v="x" 3\nm v=3.5 4')
    assert (caught.value.line, caught.value.original) == (1, 'm v="x" 3')
    assert "field type conflict" in caught.value.reason
    case = Case("s", "m", 0)
    assert len(held(installed.readback(sqlite_config(tmp_path / "points.db")), case)) == 1


@pytest.mark.usefixtures("installed")
class TestSqliteConformance(TargetConformance):
    scheme = "sqlite"

    @pytest.fixture
    def target(self, installed: TargetKind, tmp_path: Path) -> TargetConfig:
        return sqlite_config(tmp_path / "points.db", self.scheme)

    @pytest.fixture
    def second_target(self, tmp_path: Path) -> TargetConfig:
        return sqlite_config(tmp_path / "other.db", self.scheme)

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


class TestTransactionalSqliteConformance(TestSqliteConformance):
    """The transactional kind: an epoch in one SQLite transaction with its record."""

    scheme = "sqlitetx"

    def test_the_kind_is_transactional(self, target: TargetConfig) -> None:
        assert kind_of(target).name == "sqlitetx" and kind_of(target).transactional
