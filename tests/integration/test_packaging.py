"""twophase as a cluster gets it: a wheel built by ``python -m build``, installed alone in
a fresh virtualenv, prints and creates the staging schema from the migrations it carries,
lists them, and answers ``twophase status`` -- no source tree anywhere on its path."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import REPO, create_database, drop_database, unique
from twophase import __version__
from twophase.store.database import SCHEMA_REVISION

pytestmark = pytest.mark.integration


def run(*args: str | Path, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=env,
        cwd=cwd,
    )
    assert done.returncode == 0, f"{args}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--outdir", out, REPO)
    return out


@pytest.fixture(scope="module")
def installed(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the wheel and its dependencies only; its bin folder."""
    venv = tmp_path_factory.mktemp("venv")
    run(sys.executable, "-m", "venv", venv)
    (wheel,) = dist.glob("*.whl")
    run(venv / "bin" / "python", "-m", "pip", "install", "-q", wheel)
    return venv / "bin"


@pytest.fixture
def empty_store(base_staging_url: str) -> Iterator[str]:
    name = unique("twophase_pkg")
    yield create_database(base_staging_url, name)
    drop_database(base_staging_url, name)


def test_the_wheel_carries_the_package_the_migrations_and_the_script(dist: Path) -> None:
    (wheel,) = dist.glob(f"twophase-{__version__}-py3-none-any.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "twophase/migrations/env.py" in names
    assert f"twophase/migrations/versions/{SCHEMA_REVISION}.py" in names
    assert "twophase/operations/exporter.py" in names and "twophase/py.typed" in names
    assert "twophase/migrations/__init__.py" in names
    entry_points = zipfile.ZipFile(wheel).read(f"twophase-{__version__}.dist-info/entry_points.txt")
    assert b"twophase = twophase.cli:main" in entry_points
    assert not [n for n in names if n.startswith(("tests/", "bench/", "jobs/"))]
    (sdist,) = dist.glob(f"twophase-{__version__}.tar.gz")
    assert sdist.stat().st_size > 0


def test_an_installed_wheel_creates_the_schema_and_answers_status(
    installed: Path, empty_store: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TWOPHASE_", "PYTHON"))}
    env |= {"TWOPHASE_STAGING_URL": empty_store, "PATH": f"{installed}:{env.get('PATH', '')}"}
    where = run(
        installed / "python", "-c", "import twophase; print(twophase.__file__)", cwd=tmp_path
    )
    assert str(REPO) not in where and "site-packages" in where

    assert run(installed / "twophase", "--version", env=env, cwd=tmp_path).strip() == (
        f"twophase {__version__}"
    )
    script = run(installed / "twophase", "db", "upgrade", "--sql", env=env, cwd=tmp_path)
    assert "CREATE TABLE twophase_sinks (" in script and script.rstrip().endswith("COMMIT;")
    before = run(installed / "twophase", "db", "current", env=env, cwd=tmp_path)
    assert "no schema" in before  # the SQL was printed, not run
    upgraded = run(installed / "twophase", "db", "upgrade", env=env, cwd=tmp_path)
    assert f"no schema -> {SCHEMA_REVISION}" in upgraded
    history = run(installed / "twophase", "db", "history", env=env, cwd=tmp_path)
    assert "0001_initial" in history and f"{SCHEMA_REVISION} (at the head)" in history
    again = run(installed / "twophase", "db", "upgrade", env=env, cwd=tmp_path)
    assert f"{SCHEMA_REVISION} (at the head)" in again  # idempotent
    status = run(installed / "twophase", "status", env=env, cwd=tmp_path)
    assert status.strip() == "no sinks in this staging store"
