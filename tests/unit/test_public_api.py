"""The Python API: ``from twophase import ...`` gives the documented names, and importing
the package costs an executor nothing until a name is used."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys

import pytest

import twophase
from tests.support import REPO

PUBLIC = [name for name in twophase.__all__ if name != "__version__"]


@pytest.mark.parametrize("name", PUBLIC)
def test_each_public_name_is_the_object_its_module_defines(name: str) -> None:
    home = importlib.import_module(twophase._HOMES[name])
    assert getattr(twophase, name) is getattr(home, name)
    assert name in dir(twophase)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Ledger'"):
        twophase.Ledger  # noqa: B018


def test_importing_the_package_imports_nothing_else() -> None:
    probe = (
        "import sys, twophase; print(' '.join(sorted(m for m in sys.modules if "
        "m.startswith('twophase.') or m.split('.')[0] in "
        "{'psycopg', 'sqlalchemy', 'pyspark', 'influxdb_client', 'urllib3', 'numpy'})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert done.stdout.split() == []


def test_the_python_api_guide_imports_from_the_public_api() -> None:
    guide = (REPO / "docs" / "guides" / "python-api.md").read_text()
    imported = re.findall(r"^from twophase import (.+)$", guide, flags=re.M)
    names = {n.strip() for line in imported for n in line.split(",")}
    assert {"DriverCommitter", "PointBuilder", "PointSpec", "load_config"} <= names
    assert names <= set(twophase.__all__)


def test_all_lists_exactly_the_lazy_names_and_the_version() -> None:
    assert set(twophase.__all__) == {*twophase._HOMES, "__version__"}
