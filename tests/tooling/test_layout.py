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
        "from twophase.protocol.ledger.target_ledger import TargetState",
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


_RESEND_PATH = (
    "operations/resender.py",
    "operations/resend.py",
    "cli/parser.py",
    "cli/commands.py",
)


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


def _dotted(name: str) -> str:
    """``protocol/stage/stager.py`` -> ``twophase.protocol.stage.stager``."""
    parts = ["twophase", *Path(name).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# The modules the map marks as running in Spark's Python workers.
_EXECUTOR_MODULES = sorted(
    _dotted(name)
    for name in re.findall(r"^\| `([\w/]+\.py)` \| \(executors\) ", MODULE_MAP, flags=re.M)
)
# What executors must not load: SQLAlchemy, Alembic, the InfluxDB client, and the
# driver's side of twophase.
_DRIVER_SIDE_LIBRARIES = ("sqlalchemy", "alembic", "urllib3")
_DRIVER_SIDE_PACKAGES = (
    "twophase.protocol.deliver",
    "twophase.protocol.ledger",
    "twophase.protocol.maintain",
    "twophase.protocol.commit",
    "twophase.influx",
    "twophase.postgresql",
    "twophase.operations",
    "twophase.cli",
)


def test_the_map_marks_the_executors_modules() -> None:
    """The marks the next test reads are there: the staging task, the split UDF and
    phase 1 at least (a page that lost its marks would check nothing)."""
    assert {
        "twophase.spark.staging_task",
        "twophase.spark.dead_letter_split",
        "twophase.protocol.stage.stager",
    } <= set(_EXECUTOR_MODULES)


@pytest.mark.parametrize("module", _EXECUTOR_MODULES)
def test_executor_modules_import_no_driver_side_code(module: str) -> None:
    """Spark unpickles a staging task or the split UDF in every Python worker: what it
    imports is paid per worker, and the commit side (SQLAlchemy, the ledger, InfluxDB
    writers) has no business there."""
    import subprocess
    import sys

    probe = (
        f"import sys, {module}; "
        f"print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
        f"{_DRIVER_SIDE_LIBRARIES!r} or m.startswith({_DRIVER_SIDE_PACKAGES!r}))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert done.stdout.split() == []


def test_no_module_name_is_used_twice() -> None:
    """One name per module across the package: a file's or a folder's (``__init__.py``
    aside), so that a name says which module it is wherever it appears."""
    names = [p.stem for p in MODULES if p.name != "__init__.py"]
    names += [p.parent.name for p in MODULES if p.name == "__init__.py" and p.parent != PACKAGE]
    assert sorted({n for n in names if names.count(n) > 1}) == []


# -- layers ------------------------------------------------------------------------------

_ALL = {_dotted(_name(p)): p for p in MODULES}


def _layers(page: str) -> list[set[str]]:
    """The map's numbered list of layers, lowest first: the backquoted names of each
    line (``protocol/stage`` -> ``twophase.protocol.stage``)."""
    return [
        {f"twophase.{name.replace('/', '.')}" for name in re.findall(r"`([\w/]+)`", line)}
        for line in re.findall(r"^\d+\. (.*)$", page, flags=re.M)
    ]


LAYERS = _layers(MODULE_MAP)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(module: str, names: list[str]) -> set[str]:
    """The package's modules an import names: ``from a.b import c`` is ``a.b.c`` when
    that is a module, else ``a.b``."""
    found = {f"{module}.{n}" for n in names if f"{module}.{n}" in _ALL}
    if len(found) < len(names):
        found.add(module)
    return found


def imports_of(source: str, module: str, *, package: bool = False) -> set[str]:
    """The twophase modules ``module``'s source imports, at any depth (in functions too),
    except under ``if TYPE_CHECKING:``; relative imports resolved."""
    found: set[str] = set()
    nodes: list[ast.AST] = [ast.parse(source)]
    while nodes:
        node = nodes.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            nodes.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module if package else module.rsplit(".", 1)[0]
                parent = parent.rsplit(".", node.level - 1)[0] if node.level > 1 else parent
                base = f"{parent}.{base}" if base else parent
            found |= _resolve(base, [alias.name for alias in node.names])
        nodes.extend(ast.iter_child_nodes(node))
    return {m for m in found if m.split(".")[0] == "twophase"} - {module}


def _layer_of(module: str) -> int | None:
    """The index of the layer holding ``module`` (its longest named prefix), or None
    for the package itself."""
    best: tuple[int, int] | None = None
    for index, layer in enumerate(LAYERS):
        for name in layer:
            if (module == name or module.startswith(f"{name}.")) and (
                best is None or len(name) > best[0]
            ):
                best = (len(name), index)
    return None if best is None else best[1]


def back_up(graph: dict[str, set[str]]) -> list[str]:
    """Every import that runs from a layer to one after it in the map's list."""
    found = []
    for module, imported in sorted(graph.items()):
        mine = _layer_of(module)
        for other in sorted(imported):
            theirs = _layer_of(other)
            if mine is not None and theirs is not None and theirs > mine:
                found.append(f"{module} -> {other}")
    return found


def circle(graph: dict[str, set[str]]) -> list[str]:
    """An import circle among the modules, or [] when there is none."""
    import graphlib

    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        return list(error.args[1])
    return []


def _graph() -> dict[str, set[str]]:
    return {
        module: imports_of(path.read_text(), module, package=path.name == "__init__.py")
        for module, path in _ALL.items()
    }


def test_every_module_has_a_layer() -> None:
    """The map's list of layers covers the package: only ``twophase`` itself and the
    ``protocol`` folder of layers, which load nothing when imported, stand outside it."""
    assert len(LAYERS) >= 10
    assert sorted(m for m in _ALL if _layer_of(m) is None) == ["twophase", "twophase.protocol"]


def test_imports_never_run_back_up_the_layers() -> None:
    assert back_up(_graph()) == []


def test_there_is_no_import_circle() -> None:
    assert circle(_graph()) == []


def test_the_layer_checks_catch_a_bad_import() -> None:
    """The checks above can fail: an import back up, and a circle, are found."""
    stager = "twophase.protocol.stage.stager"
    source = "def f():\n    from twophase.protocol.commit.runtime import TwoPhase\n"
    assert back_up({stager: imports_of(source, stager)}) == [
        f"{stager} -> twophase.protocol.commit.runtime"
    ]
    only_typing = "if TYPE_CHECKING:\n    from twophase.protocol.commit import runtime\n"
    assert imports_of(only_typing, stager) == set()
    relative = "from ..commit import runtime\n"
    assert imports_of(relative, stager) == {"twophase.protocol.commit.runtime"}
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) != []
    assert circle({"a": {"b"}, "b": set()}) == []


def test_the_unit_tests_mirror_the_package() -> None:
    """Each folder of ``tests/unit`` is a sub-package of twophase (its unit tests), and
    no test module's name is used twice there or in ``tests/tooling``."""
    unit = REPO / "tests" / "unit"
    folders = [p.relative_to(unit) for p in unit.rglob("*") if p.is_dir() and p.name[0] != "_"]
    assert folders and all((PACKAGE / folder / "__init__.py").exists() for folder in folders)
    names = [p.name for d in ("unit", "tooling") for p in (REPO / "tests" / d).rglob("test_*.py")]
    assert len(names) == len(set(names))
