"""Kinds of target from a package of their own, found only through their entry points:
the example SQLite kinds, ``examples/sqlite-target``, installed with pip from the
repository into a folder put on ``sys.path``, as users install a kind. A sink delivers
to the overwriting one end to end, and the package's own tests, which run the
conformance kit against both kinds (the transactional one, ``sqlitetx``, as a
third-party kind that keeps its own record of delivered epochs, keyed on the
generation twophase gives it), pass against the installed package."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.staging import lines, stage
from tests.support import SQLITE_EXAMPLE, target_config
from twophase.config import TargetConfig, load_config
from twophase.errors import BadPointsError, TargetNotFoundError
from twophase.model import EpochState
from twophase.protocol.commit.runtime import TwoPhase
from twophase.targets import ENTRY_POINT_GROUP, TargetKind, kind_of, kinds, make_writer
from twophase.testing import held, normalized
from twophase.testing.support import Case

PACKAGE = "twophase_sqlite_target"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip install --target`` of ``examples/sqlite-target``: its module and its
    ``*.dist-info`` (the entry points), built from its ``pyproject.toml``."""
    site = tmp_path_factory.mktemp("site")
    # Built from a copy: setuptools builds in the source folder (build/, *.egg-info).
    source = shutil.copytree(SQLITE_EXAMPLE, tmp_path_factory.mktemp("src") / "sqlite-target")
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site)]
    done = subprocess.run(
        [*pip, str(source)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return site


@pytest.fixture(scope="module")
def installed(site: Path) -> Iterator[TargetKind]:
    """The installed package on ``sys.path``; the kinds looked up again. Taken away
    afterwards."""
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


def test_the_packages_own_tests_pass_the_conformance_kit(site: Path, base_staging_url: str) -> None:
    """``pytest`` in ``examples/sqlite-target``, as its authors run it, against the
    installed package: the kit's checks of both kinds."""
    # -P: the package is imported from where pip put it, not from the folder pytest runs in.
    env = {
        **os.environ,
        "PYTHONPATH": str(site),
        "TWOPHASE_STAGING_URL": base_staging_url,
    }
    done = subprocess.run(
        [sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"],
        cwd=SQLITE_EXAMPLE,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    # Skipped: the checks of the other mode (a record, a transaction) and of credentials.
    summary = done.stdout.strip().splitlines()[-1]
    assert re.match(r"\d{2,} passed", summary) and "failed" not in summary, summary
