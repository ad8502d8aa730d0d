"""Shared fixtures: server URLs from the environment, markers derived from folders, and
the ``full`` marker's selection.

The servers are started by ``scripts/dev.sh test`` (or ``eval "$(scripts/dev.sh env)"``).
Sub-folders add their own conftest.py; keep this one small.

Tests (or parameter combinations, ``pytest.param(..., marks=pytest.mark.full)``) marked
``full`` are the exhaustive matrices: every fault kind keeps a test in the default run,
and the rest of its combinations run only with ``--full`` (``scripts/dev.sh test
--full``) or ``TWOPHASE_FULL=1``, or when named on the command line by their node id.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from twophase.config import ALIASES, env_name

TESTS_DIR = Path(__file__).resolve().parent


def _current_names() -> None:
    """Move variables under a setting's former name (``TWOPHASE_INFLUX_URL``, from a shell
    set up before the rename) to its current one: tests set and delete the current names,
    and a former one left beside a changed current one would be a conflict."""
    for alias, option in ALIASES.items():
        value = os.environ.pop(env_name(alias), None)
        if value is not None:
            os.environ.setdefault(env_name(option), value)


_current_names()

# tests/<folder>/... -> marker; lets `pytest -m unit` work without decorating every test.
# The tooling's tests (bench, docs, deploy, devkit...) need no servers either.
FOLDER_MARKERS = {
    "unit": "unit",
    "tooling": "unit",
    "integration": "integration",
    "e2e": "e2e",
    "soak": "soak",
}

# fixture name -> environment variable it reads.
URL_FIXTURES = {
    "staging_url": "TWOPHASE_STAGING_URL",
    "influx_v1_url": "TWOPHASE_TARGET_URL",
    "vm_url": "TWOPHASE_TEST_VM_URL",
}

# Tests with these markers exist to exercise real servers: a missing server is a failure,
# never a silent skip (a green CI run without servers would prove nothing).
SERVER_MARKERS = ("integration", "e2e")


# Under pytest-xdist (`-n 2 --dist loadgroup`, as `scripts/dev.sh test` runs it) the
# tests that start Spark run one after the other on one worker (SparkApart): each Spark
# job takes both cores while it starts, and two at once would only make each slower.
SPARK_FOLDERS = ("tests/e2e/", "tests/soak/")


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(SparkApart(), "twophase-spark-apart")


class SparkApart:
    """pytest-xdist's scheduling of ``--dist loadgroup`` with one group, the Spark tests
    (its own ``xdist_group`` marks do not group under this pytest: they rename node
    ids, which pytest 9 no longer reads); every other test is a unit of its own."""

    @staticmethod
    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
        if config.getvalue("dist") != "loadgroup":
            return None
        from xdist.scheduler import LoadScopeScheduling

        class Scheduling(LoadScopeScheduling):  # type: ignore[misc]  # untyped
            def _split_scope(self, nodeid: str) -> str:
                return "spark" if nodeid.startswith(SPARK_FOLDERS) else nodeid

        return Scheduling(config, log)


# `--full` or TWOPHASE_FULL=1 (any value but empty or 0): also run the tests marked `full`.
FULL_ENV = "TWOPHASE_FULL"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--full",
        action="store_true",
        default=False,
        help=f"also run the tests marked `full`, the exhaustive matrices (or set {FULL_ENV}=1)",
    )


def full_run(config: pytest.Config) -> bool:
    return bool(config.getoption("--full")) or os.environ.get(FULL_ENV, "") not in ("", "0")


def pytest_report_header(config: pytest.Config) -> str:
    if full_run(config):
        return "twophase: full run (tests marked `full` included)"
    return "twophase: default run (tests marked `full` deselected; --full runs them)"


@pytest.hookimpl(tryfirst=True)  # before `-m` deselection sees the items
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        try:
            folder = item.path.resolve().relative_to(TESTS_DIR).parts[0]
        except (ValueError, IndexError):
            continue
        marker = FOLDER_MARKERS.get(folder)
        if marker is not None:
            item.add_marker(marker)
    if full_run(config):
        return
    named = named_on_command_line(config)
    dropped = [
        item
        for item in items
        if item.get_closest_marker("full") is not None and not named(item.nodeid)
    ]
    if dropped:
        gone = set(map(id, dropped))
        items[:] = [item for item in items if id(item) not in gone]
        config.hook.pytest_deselected(items=dropped)


def named_on_command_line(config: pytest.Config) -> Callable[[str], bool]:
    """Whether a node id was asked for by name (``path::test`` or ``path::test[params]``):
    a test of the full matrix runs alone when named, without --full."""
    asked: set[str] = set()
    for arg in config.args:
        if "::" not in arg:
            continue
        path, _, rest = arg.partition("::")
        try:
            relative = Path(path).resolve().relative_to(config.rootpath)
        except ValueError:
            continue
        asked.add(f"{relative.as_posix()}::{rest}")
    return lambda nodeid: nodeid in asked or nodeid.split("[", 1)[0] in asked


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Decided here, per test, rather than in the session fixtures: pytest caches a session
    # fixture's failure and would replay the first test's verdict to all later ones.
    # item.fixturenames includes fixtures requested indirectly through other fixtures.
    missing = [
        env
        for name, env in URL_FIXTURES.items()
        if name in getattr(item, "fixturenames", ()) and not os.environ.get(env)
    ]
    if not missing:
        return
    message = (
        f"{', '.join(missing)} not set: start the servers and export their URLs with "
        '`scripts/dev.sh setup && eval "$(scripts/dev.sh env)"`, or run `scripts/dev.sh test`'
    )
    if any(item.get_closest_marker(m) for m in SERVER_MARKERS):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def _env_url(env: str) -> str:
    value = os.environ.get(env)
    if not value:  # normally caught by pytest_runtest_setup first
        pytest.fail(f"{env} is not set; run the tests via `scripts/dev.sh test`", pytrace=False)
    return value


@pytest.fixture(scope="session")
def staging_url() -> str:
    """SQLAlchemy URL of the PostgreSQL staging database."""
    return _env_url(URL_FIXTURES["staging_url"])


@pytest.fixture(scope="session")
def influx_v1_url() -> str:
    """Base URL of the InfluxDB 1.x HTTP API, e.g. http://127.0.0.1:18086."""
    return _env_url(URL_FIXTURES["influx_v1_url"])


@pytest.fixture(scope="session")
def vm_url() -> str:
    """Base URL of VictoriaMetrics (InfluxDB line protocol on /write and /api/v2/write)."""
    return _env_url(URL_FIXTURES["vm_url"])
