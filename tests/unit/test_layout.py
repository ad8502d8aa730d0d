"""The shape of the package: one vocabulary, one source per setting, the design document
true to the code, and a CLI that only parses, calls and renders. (Small functions are
ruff's to check: C901, PLR0912, PLR0915 in pyproject.toml.)"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from twophase.config import SETTINGS

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "twophase"
# The Alembic migrations ship inside the package but are Alembic's scripts, not its modules.
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts)
DESIGN = (REPO / "docs" / "concepts" / "design.md").read_text()


def _name(path: Path) -> str:
    return str(path.relative_to(PACKAGE))


def test_the_design_maps_every_module() -> None:
    mapped = set(re.findall(r"^\| `([\w/]+\.py)` \|", DESIGN, flags=re.M))
    assert mapped == {_name(path) for path in MODULES}


def test_every_invariant_cited_is_defined_in_the_design() -> None:
    defined = set(re.findall(r"^- \*\*(I\d)\*\*", DESIGN, flags=re.M))
    assert defined == {f"I{n}" for n in range(1, 10)}
    pages = sorted((REPO / "docs").rglob("*.md"))
    sources = [*MODULES, REPO / "README.md", *pages]
    cited = {i for path in sources for i in re.findall(r"\bI(\d)\b", path.read_text())}
    assert {f"I{n}" for n in cited} <= defined


@pytest.mark.parametrize("text", ["5000", "4 * 1024 * 1024"])
def test_each_default_is_written_once(text: str) -> None:
    found = [
        f"{_name(path)}:{number}"
        for path in MODULES
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(rf"(?<![\w.]){re.escape(text)}(?![\w.])", line)
    ]
    assert len(found) == 1, found


def test_the_settings_reference_lists_every_setting() -> None:
    """The reference is generated from SETTINGS where the settings page asks for it."""
    from scripts import docs_reference

    page = (REPO / "docs" / "reference" / "settings.md").read_text()
    assert "<!-- generated: settings -->" in page
    reference = docs_reference.expand(page)
    missing = [s.env for s in SETTINGS if f"`{s.env}`" not in reference]
    assert missing == []
    assert [s.name for s in SETTINGS if f"| `{s.name}` |" not in reference] == []


_SQL = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|COPY)\b")
_PROTOCOL = ("database", "ledger", "reader", "stager", "promoter", "committer", "gc", "runtime")


@pytest.mark.parametrize("path", sorted((PACKAGE / "cli").glob("*.py")), ids=_name)
def test_the_cli_holds_no_sql_and_no_protocol(path: Path) -> None:
    tree = ast.parse(path.read_text())
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)]
    assert not [s for s in strings if isinstance(s, str) and _SQL.search(s)]
    imported = {
        n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module is not None
    }
    assert not {m for m in imported if m.split(".")[-1] in _PROTOCOL and m.startswith("twophase")}


_RESEND_PATH = ("protocol/resend.py", "operations/delivery.py", "cli/parser.py", "cli/commands.py")


@pytest.mark.parametrize("name", _RESEND_PATH)
def test_the_resend_path_never_says_replay(name: str) -> None:
    """An operator's resend is never called a replay: where the word appears on the
    resend path, it is to name Spark's replays."""
    lines = (PACKAGE / name).read_text().splitlines()
    assert [line for line in lines if "replay" in line.lower() and "Spark" not in line] == []


def test_there_is_no_replay_command() -> None:
    from twophase.cli import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert "resend" in commands and "replay" not in commands


@pytest.mark.parametrize("module", ["twophase.spark.stage", "twophase.spark.split"])
def test_executor_modules_import_no_driver_side_code(module: str) -> None:
    """Spark unpickles a staging task or the split UDF in every Python worker: what it
    imports is paid per worker, and the commit side (SQLAlchemy, the ledger, InfluxDB
    writers) has no business there."""
    import subprocess
    import sys

    probe = (
        f"import sys, {module}; "
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'sqlalchemy', 'alembic', 'urllib3'} or m in {'twophase.protocol.ledger', "
        "'twophase.protocol.committer', 'twophase.protocol.promoter', 'twophase.influx.writers'})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert done.stdout.split() == []
