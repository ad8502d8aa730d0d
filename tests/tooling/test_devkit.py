"""The dev kit's place: the tests and the benchmark share devkit/, the benchmark takes
nothing from tests/, no test module takes from another, and the wheel ships none of it."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[2]
# Test modules that still import from another test module, until their owners move
# those imports to the helper modules (tests/staging.py, tests/integration/fanout_helpers.py).


def _imports(path: Path) -> Iterator[str]:
    """Every module ``path`` imports, at any depth of its code."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module


def _name(path: Path) -> str:
    return str(path.relative_to(REPO))


def test_the_benchmark_imports_nothing_from_the_tests() -> None:
    found = [
        f"{_name(path)}: {module}"
        for path in sorted((REPO / "bench").rglob("*.py"))
        for module in _imports(path)
        if module == "tests" or module.startswith("tests.")
    ]
    assert found == []


def test_no_test_module_imports_from_another() -> None:
    found = [
        f"{_name(path)}: {module}"
        for path in sorted((REPO / "tests").rglob("test_*.py"))
        for module in _imports(path)
        if module.startswith("tests.") and module.rsplit(".", 1)[-1].startswith("test_")
    ]
    assert found == []


def test_the_dev_kit_is_not_in_the_wheel() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = project["tool"]["setuptools"]["packages"]
    assert all(name == "twophase" or name.startswith("twophase.") for name in packages)


def test_the_dev_kit_needs_only_the_standard_library() -> None:
    """scripts/dev.sh runs it with the system's python3, before the virtualenv exists."""
    found = [
        f"{_name(path)}: {module}"
        for path in sorted((REPO / "devkit").rglob("*.py"))
        for module in _imports(path)
        if module.split(".")[0] not in {*sys.stdlib_module_names, "devkit"}
    ]
    assert found == []
