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
CONCEPTS = REPO / "docs" / "concepts"
MODULE_MAP = (CONCEPTS / "module-map.md").read_text()
INVARIANTS = (CONCEPTS / "invariants.md").read_text()


def _name(path: Path) -> str:
    return str(path.relative_to(PACKAGE))


def test_the_design_maps_every_module() -> None:
    mapped = set(re.findall(r"^\| `([\w/]+\.py)` \|", MODULE_MAP, flags=re.M))
    assert mapped == {_name(path) for path in MODULES}


def test_every_invariant_cited_is_defined_in_the_design() -> None:
    defined = set(re.findall(r"^- \*\*(I\d+)\*\*", INVARIANTS, flags=re.M))
    assert defined == {f"I{n}" for n in range(1, 11)}
    pages = sorted((REPO / "docs").rglob("*.md"))
    sources = [*MODULES, REPO / "README.md", *pages]
    cited = {i for path in sources for i in re.findall(r"\bI(\d+)\b", path.read_text())}
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
# What the CLI may import from twophase: the operations (their argument and result types
# included), the configuration, errors, words, log setup, and itself.
_CLI_MAY_IMPORT = (
    "twophase.operations",
    "twophase.config",
    "twophase.errors",
    "twophase.wording",
    "twophase.logs",
    "twophase.cli",
)
_CLI_MAY_TAKE_FROM_TWOPHASE = {"__version__"}  # ``from twophase import __version__``


def _twophase_imports(tree: ast.AST) -> set[str]:
    """The twophase modules (or ``twophase.<name>`` for a name of the package itself) a
    module imports, relative imports resolved against the CLI package."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: from inside twophase/cli
                base = "twophase.cli".rsplit(".", node.level - 1)[0]
                module = f"{base}.{module}" if module else base
            if module == "twophase":  # a submodule (``logs``) or a name of the package
                found |= {f"twophase.{alias.name}" for alias in node.names}
            else:
                found.add(module)
    return {m for m in found if m == "twophase" or m.startswith("twophase.")}


def _allowed_in_cli(module: str) -> bool:
    if module in {f"twophase.{name}" for name in _CLI_MAY_TAKE_FROM_TWOPHASE}:
        return True
    return any(module == top or module.startswith(f"{top}.") for top in _CLI_MAY_IMPORT)


@pytest.mark.parametrize("path", sorted((PACKAGE / "cli").glob("*.py")), ids=_name)
def test_the_cli_holds_no_sql_and_only_calls_operations(path: Path) -> None:
    """The CLI parses, calls an operation and renders: no SQL of its own, and from twophase
    it imports only the operations (which export every type their callers need), the
    configuration, errors, words, log setup and the version."""
    tree = ast.parse(path.read_text())
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)]
    assert not [s for s in strings if isinstance(s, str) and _SQL.search(s)]
    imported = _twophase_imports(tree)
    assert imported, "no twophase import found: is the check looking at the right code?"
    assert sorted(m for m in imported if not _allowed_in_cli(m)) == []


def test_the_cli_import_check_catches_protocol_and_store() -> None:
    """The allow-list check above refuses what the CLI must not import."""
    refused = [
        "from twophase.protocol.requeue import RequeueFilter",
        "from twophase.store.views import EpochRange",
        "import twophase.store.database",
        "from twophase import model",
        "from twophase.influx import api",
        "from twophase.operationsx import thing",
        "from ..protocol import ledger",
    ]
    for source in refused:
        imported = _twophase_imports(ast.parse(source))
        assert [m for m in imported if not _allowed_in_cli(m)], source
    allowed = [
        "from twophase import __version__, logs",
        "from twophase import operations as ops",
        "from twophase.operations.exporter import DEFAULT_PORT",
        "from twophase.config.urls import has_password",
        "from .console import Console",
        "import argparse",
    ]
    for source in allowed:
        imported = _twophase_imports(ast.parse(source))
        assert [m for m in imported if not _allowed_in_cli(m)] == [], source


_RESEND_PATH = ("protocol/resend.py", "operations/resend.py", "cli/parser.py", "cli/commands.py")


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
