"""Turn the reST roles of docstrings and comments into the cross-references the
documentation site's renderer (mkdocstrings, through mkdocs-autorefs) reads.

    :class:`~twophase.config.sections.StagingConfig`
        -> [`StagingConfig`][twophase.config.sections.StagingConfig]
    :func:`load_config` (in twophase/config/__init__.py)
        -> [`load_config`][twophase.config.loading.load_config]
    :mod:`.parser` (in twophase/cli/__init__.py)
        -> [`twophase.cli.parser`][twophase.cli.parser]
    :data:`__all__`, a private name, an unknown one
        -> `__all__` (code, no link)

Each target is resolved as Python would from the module the role is written in (its
imports and definitions), then named by where the object is defined, so that the link
leads to the page that documents it. A reST literal-block marker (``text::``) becomes a
plain colon; the indented block after it is a Markdown code block as it is.

Idempotent: run it again after a rebase (``python scripts/convert_roles.py``), and it
converts only what is new. ``--check`` lists what it would change and exits 1 if anything.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

ROLE = re.compile(r":(?:py:)?(class|func|meth|mod|data|attr|exc|obj|const):`(~?)([^`]+)`")
LITERAL = re.compile(r"(\S)::$", flags=re.M)
ALONE = re.compile(r"^(\s*)::\n", flags=re.M)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except Exception:  # a module that needs what is not installed: leave its roles as code
        return None


def _defined_in(module: ModuleType, name: str) -> str:
    """Where a module-level name is defined: follows ``from x import name`` re-exports."""
    source = inspect.getsource(module)
    found = re.search(
        rf"^\s*from\s+([\w.]+)\s+import\s+(?:\([^)]*\b{name}\b[^)]*\)|[^\n]*\b{name}\b)",
        source,
        flags=re.M,
    )
    if found:
        origin = found.group(1)
        if origin.startswith("."):
            base = module.__name__
            if not hasattr(module, "__path__"):
                base = base.rpartition(".")[0]
            origin = base + origin[1:] if origin != "." else base
        inner = _import(origin)
        if inner is not None and inner is not module:
            return _defined_in(inner, name)
    return f"{module.__name__}.{name}"


def canonical(target: str, here: str) -> str | None:
    """The dotted path of the object ``target`` names, written in module ``here``; None
    when it does not resolve or is private."""
    if target.startswith("."):
        package = here if _is_package(here) else here.rpartition(".")[0]
        target = package + target
    candidates = [target] if target.startswith("twophase") else [f"{here}.{target}", target]
    for path in candidates:
        resolved = _resolve(path)
        if resolved:
            return resolved
    return None


def _is_package(name: str) -> bool:
    module = _import(name)
    return module is not None and hasattr(module, "__path__")


def _resolve(path: str) -> str | None:
    parts = path.split(".")
    if any(p.startswith("_") for p in parts):
        return None
    for cut in range(len(parts), 0, -1):
        module = _import(".".join(parts[:cut]))
        if module is None:
            continue
        rest = parts[cut:]
        if not rest:
            return module.__name__
        if not hasattr(module, rest[0]) and rest[0] not in getattr(module, "__annotations__", {}):
            return None
        obj: Any = getattr(module, rest[0], None)
        home = _home(module, rest[0], obj)
        for attr in rest[1:]:
            if obj is None or not (hasattr(obj, attr) or _annotated(obj, attr)):
                return None
            obj = getattr(obj, attr, None)
            home = f"{home}.{attr}"
        return home
    return None


def _annotated(cls: Any, attr: str) -> bool:
    return inspect.isclass(cls) and any(
        attr in getattr(k, "__annotations__", {}) for k in cls.__mro__
    )


def _home(module: ModuleType, name: str, obj: Any) -> str:
    if inspect.ismodule(obj):
        return obj.__name__
    if (inspect.isclass(obj) or inspect.isfunction(obj)) and obj.__module__.startswith("twophase"):
        return f"{obj.__module__}.{obj.__qualname__}"
    return _defined_in(module, name)


LINE_LENGTH = 100  # ruff's line-length (pyproject.toml)


def _wrap(line: str) -> list[str]:
    """A docstring or comment line that a link made too long, cut at spaces outside code
    spans and links, each part with the line's indentation (and ``# `` for a comment)."""
    indent = line[: len(line) - len(line.lstrip())]
    text = line.lstrip()
    prefix = indent + ("# " if text.startswith("# ") else "")
    if text.removeprefix("# ")[:2] in ("- ", "* "):  # a list item's hanging indent
        prefix += "  "
    parts: list[str] = []
    while len(line) > LINE_LENGTH:
        cut = _cut(line)
        if cut is None:
            break
        parts.append(line[:cut].rstrip())
        line = prefix + line[cut:].lstrip()
    return [*parts, line]


def _cut(line: str) -> int | None:
    """The last space before the limit that is outside backticks and brackets."""
    best = None
    ticks = depth = 0
    for index, char in enumerate(line[: LINE_LENGTH + 1]):
        if char == "`":
            ticks ^= 1
        elif char == "[" and not ticks:
            depth += 1
        elif char == "]" and not ticks:
            depth = max(depth - 1, 0)
        elif char == " " and not ticks and not depth and line[:index].strip():
            best = index
    indent = len(line) - len(line.lstrip())
    return best if best is not None and best > indent + 2 else None


def convert(text: str, here: str) -> str:
    lines = []
    for line in text.split("\n"):
        new = _convert_line(line, here)
        lines += _wrap(new) if new != line and len(new) > LINE_LENGTH else [new]
    return ALONE.sub("", LITERAL.sub(r"\1:", "\n".join(lines)))


def _convert_line(text: str, here: str) -> str:
    def role(match: re.Match[str]) -> str:
        kind, short, target = match.groups()
        target = target.strip()
        shown = target.lstrip(".").rsplit(".", 1)[-1] if short else target.lstrip(".")
        if kind == "mod" and target.startswith("."):
            shown = canonical(target, here) or shown
        path = canonical(target, here)
        if path is None:
            return f"`{shown}`"
        if len(shown) + len(path) > LINE_LENGTH - 30:  # a link that would fill a line alone
            shown = ".".join(shown.split(".")[-2:])
        return f"[`{shown}`][{path}]"

    return ROLE.sub(role, text)


def files() -> list[Path]:
    return sorted(p for p in (REPO / "twophase").rglob("*.py") if "migrations" not in p.parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if needed")
    args = parser.parse_args(argv)
    changed = []
    for path in files():
        before = path.read_text()
        after = convert(before, module_name(path))
        if after != before:
            changed.append(path.relative_to(REPO))
            if not args.check:
                path.write_text(after)
    for path in changed:
        print(("would convert " if args.check else "converted ") + str(path))
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
