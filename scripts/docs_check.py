"""``python -m scripts.docs_check``: what ``mkdocs build --strict`` lets through.

The strict build fails on a broken link or a missing page; it renders anything
else. This reads the pages (``README.md``, ``docs/``, ``bench/README.md``) and the
docstrings the API reference shows, and reports, as ``path:line: problem``:

* a fence left open at the end of a page, or one opened without a language (a
  stray closing fence opens a block that runs to the next fence: prose becomes
  code);
* a paragraph that starts in lower case or ends without closing punctuation (a
  sentence cut on its way in or out);
* a table header with no rows under it;
* a word or a code span written twice in a row;
* a repository file a page names that does not exist, and an install command naming
  a wheel of another version;
* a snippet marker that the build would not expand: one mangled on its way in
  (``--8 < --"path"``, as a formatter leaves it) or naming a file that does not
  exist;
* a docstring paragraph with a short line in its middle (a line wrapped twice: the
  API reference shows the break).

Exit status 1 when anything is found. The tooling tests run it (``tests/tooling``), so CI
does.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

__all__ = ["Problem", "check_docstrings", "check_page", "main", "pages"]

FENCE = re.compile(r"^\s*(```+|~~~+)(.*)$")
TABLE_ROW = re.compile(r"^\s*\|.*\|\s*$")
TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")
# A line that is no paragraph's: headings, lists, quotes, tables, HTML, link
# definitions, admonitions and their bodies, the generated-reference markers.
NOT_PROSE = re.compile(r"^\s*(#|[-*+] |\d+[.)] |>|\||<|\[[^\]]+\]:|!!!|\?\?\?|\$\$|---|===|--8<--)")
LIST_ITEM = re.compile(r"^\s*([-*+]|\d+[.)]) ")
# Names written in lower case even at a sentence's start.
NAMES = ("twophase", "libpq", "psycopg", "pyarrow", "pip ", "mkdocs")
ENDS = tuple(".!?:;)}")  # (``}``: an attribute list, ``{ .md-button }``)
# What may close a sentence after its punctuation: emphasis, a code span, a quote.
CLOSERS = "*_`\"'\u201d\u2019"
REPO_PATH = re.compile(
    r"`((?:bench|scripts|jobs|twophase|tests|docs|migrations|requirements|\.ci)/[\w./-]+)`"
)
# The same word or code span twice in a row ("the the", "`x` `x`").
DOUBLED = re.compile(r"(?<![\w`])(`[^`]+`|[A-Za-z]{2,})\s+\1(?![\w`])")
WHEEL = re.compile(r"twophase-(\d+\.\d+\.\d+)-py3")
# A snippet marker as pymdownx.snippets expands it, and anything that looks like one.
SNIPPET = re.compile(r'^\s*--8<-- "([^"]+)"\s*$')
SNIPPET_LIKE = re.compile(r"^\s*-+\s*8\s*<\s*-+")
SHORT_LINE = 0.3  # a docstring line under this share of its longest neighbour's length


@dataclass(frozen=True)
class Problem:
    """One thing found: where, and what."""

    path: Path
    line: int
    what: str

    def __str__(self) -> str:
        where = self.path.relative_to(REPO) if self.path.is_relative_to(REPO) else self.path
        return f"{where}:{self.line}: {self.what}"


def pages(root: Path = REPO) -> list[Path]:
    """The pages a reader sees: the README, the site's pages and the bench's README."""
    site = sorted((root / "docs").rglob("*.md"))
    return [root / "README.md", *site, root / "bench" / "README.md"]


def check_page(path: Path, text: str, version: str, root: Path = REPO) -> list[Problem]:
    """Every problem of one Markdown page."""
    lines = text.splitlines()
    prose = _outside_fences(path, lines)
    found = list(prose.problems)
    found += _paragraphs(path, lines, prose.code)
    found += _tables(path, lines, prose.code)
    found += _names(path, lines, version, root)
    found += _doubled(path, lines, prose.code)
    found += _snippets(path, lines, root)
    return found


@dataclass(frozen=True)
class _Fenced:
    code: frozenset[int]  # line indexes inside a fence, the fences included
    problems: list[Problem]


def _outside_fences(path: Path, lines: Sequence[str]) -> _Fenced:
    code: set[int] = set()
    problems: list[Problem] = []
    opened: tuple[int, str] | None = None
    for index, line in enumerate(lines):
        match = FENCE.match(line)
        if match is None:
            if opened is not None:
                code.add(index)
            continue
        code.add(index)
        mark, info = match.groups()
        if opened is None:
            opened = (index, mark)
            if not info.strip():
                problems.append(Problem(path, index + 1, "a fence opened without a language"))
        elif mark.startswith(opened[1]) and not info.strip():
            opened = None
    if opened is not None:
        problems.append(Problem(path, opened[0] + 1, "a fence never closed"))
    return _Fenced(frozenset(code), problems)


def _paragraphs(path: Path, lines: Sequence[str], code: frozenset[int]) -> Iterator[Problem]:
    for start, block in _blocks(lines, code):
        first, last = block[0].strip(), block[-1].rstrip()
        before = _neighbour(lines, start - 1, -1)
        after = _neighbour(lines, start + len(block), 1)
        # After a code block, a sentence may go on in lower case ("prints its ...").
        after_code = before in code or lines[before].startswith(("    ", "\t"))
        if first[:1].islower() and not first.startswith(NAMES) and not after_code:
            yield Problem(path, start + 1, "a paragraph that starts in lower case")
        # Before a list or a code block, a sentence may go on into it.
        leads_in = after < len(lines) and (after in code or LIST_ITEM.match(lines[after]))
        if not last.rstrip(CLOSERS).endswith(ENDS) and not leads_in:
            yield Problem(path, start + len(block), "a paragraph that ends without punctuation")
    yield from _list_ends(path, lines, code)


def _neighbour(lines: Sequence[str], index: int, step: int) -> int:
    """The index of the nearest non-blank line from ``index`` on, going by ``step``."""
    while 0 <= index < len(lines) and not lines[index].strip():
        index += step
    return index


def _list_ends(path: Path, lines: Sequence[str], code: frozenset[int]) -> Iterator[Problem]:
    """The last item of a list that ends mid-sentence: a long item, ending in a word,
    with a heading or a paragraph after it."""
    for index, line in enumerate(lines):
        if index in code or not line.strip() or index + 1 >= len(lines):
            continue
        after = _neighbour(lines, index + 1, 1)
        ends_list = not lines[index + 1].strip() and after < len(lines)
        ends_list = ends_list and not lines[after].startswith((" ", "\t")) and after not in code
        if not ends_list or LIST_ITEM.match(lines[after]) or TABLE_ROW.match(line):
            continue
        item = _item_of(lines, index)
        if item is not None and len(item.split()) >= 8 and item.rstrip()[-1:].isalpha():
            yield Problem(path, index + 1, "a list item that ends without punctuation")


def _item_of(lines: Sequence[str], index: int) -> str | None:
    """The text of the list item whose last line is ``index``; None if it is not one."""
    for back in range(index, max(index - 30, -1), -1):
        if not lines[back].strip():
            return None
        if LIST_ITEM.match(lines[back]):
            return " ".join(part.strip() for part in lines[back : index + 1])
        if not lines[back].startswith((" ", "\t")):
            return None
    return None


def _blocks(lines: Sequence[str], code: frozenset[int]) -> Iterator[tuple[int, list[str]]]:
    """Prose paragraphs, as (first line's index, lines): runs of plain lines at the left
    margin, cut by blank lines, code and anything ``NOT_PROSE``."""
    block: list[str] = []
    start = 0
    for index, line in enumerate([*lines, ""]):
        plain = (
            index not in code
            and line.strip()
            and not NOT_PROSE.match(line)
            and not line.startswith((" ", "\t"))
        )
        if plain and not block:
            start = index
        if plain:
            block.append(line)
            continue
        if block and not (NOT_PROSE.match(line) and line.strip() and index == start + len(block)):
            yield start, block
        block = []


def _tables(path: Path, lines: Sequence[str], code: frozenset[int]) -> Iterator[Problem]:
    for index, line in enumerate(lines):
        if index in code or not TABLE_ROW.match(line):
            continue
        before = lines[index - 1] if index else ""
        if TABLE_ROW.match(before):
            continue  # not a header
        rule = lines[index + 1] if index + 1 < len(lines) else ""
        if not TABLE_RULE.match(rule):
            yield Problem(path, index + 1, "a table header with no rule under it")
            continue
        row = lines[index + 2] if index + 2 < len(lines) else ""
        if not TABLE_ROW.match(row):
            yield Problem(path, index + 1, "a table header with no rows")


def _doubled(path: Path, lines: Sequence[str], code: frozenset[int]) -> Iterator[Problem]:
    for index, line in enumerate(lines):
        if index not in code and (match := DOUBLED.search(line)):
            yield Problem(path, index + 1, f"{match.group(1)} written twice")


def _names(path: Path, lines: Sequence[str], version: str, root: Path) -> Iterator[Problem]:
    for index, line in enumerate(lines):
        for name in REPO_PATH.findall(line):
            if not _exists(root, name):
                yield Problem(path, index + 1, f"names {name}, which does not exist")
        for wheel in WHEEL.findall(line):
            if wheel != version:
                yield Problem(path, index + 1, f"a {wheel} wheel; this version is {version}")


def _snippets(path: Path, lines: Sequence[str], root: Path) -> Iterator[Problem]:
    for index, line in enumerate(lines):
        if not SNIPPET_LIKE.match(line):
            continue
        marker = SNIPPET.match(line)
        if marker is None:
            yield Problem(path, index + 1, f"a snippet marker mangled: {line.strip()!r}")
        elif not (root / marker.group(1)).is_file():
            yield Problem(path, index + 1, f"a snippet of {marker.group(1)}, which does not exist")


def _exists(root: Path, name: str) -> bool:
    name = name.rstrip(".")
    if any(mark in name for mark in "*<"):
        return True  # a pattern, not a file
    # (a name without a suffix is a stem: a benchmark run's files)
    if (root / name).exists() or (root / "docs" / name).exists():
        return True
    return "." not in Path(name).name and any((root / name).parent.glob(Path(name).name + ".*"))


def check_docstrings(package: Path) -> list[Problem]:
    """Docstring paragraphs with a short line in their middle."""
    found: list[Problem] = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                found += _docstring(path, node)
    return found


def _docstring(
    path: Path, node: ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
) -> Iterator[Problem]:
    text = ast.get_docstring(node, clean=False)
    if not text or not node.body:
        return
    first = node.body[0].lineno  # the docstring's opening line
    lines = text.splitlines()
    margins = [len(line) - len(line.lstrip()) for line in lines[1:] if line.strip()]
    code = min(margins, default=0) + 4  # an example indented this far is code
    for index in range(1, len(lines) - 1):
        before, line, after = lines[index - 1], lines[index], lines[index + 1]
        if len(line) - len(line.lstrip()) >= code:
            continue
        if _wrapped_twice(before, line, after):
            yield Problem(path, first + index, f"a docstring line wrapped twice: {line.strip()!r}")


def _wrapped_twice(before: str, line: str, after: str) -> bool:
    if not (before.strip() and line.strip() and after.strip()):
        return False  # not the middle of a paragraph
    if NOT_PROSE.match(after) or line.strip().startswith(("```", ">>>", "|")):
        return False
    if before.rstrip().endswith(":") or line.rstrip().endswith((":", ".")):
        return False  # a deliberate break: before a list, or a sentence per line
    longest = max(len(before.strip()), len(after.strip()))
    return len(line.strip()) < SHORT_LINE * longest and len(before.strip()) > 60


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.docs_check", description=__doc__)
    parser.add_argument("paths", nargs="*", type=Path, help="pages (default: every page)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    import twophase

    found: list[Problem] = []
    for page in args.paths or pages():
        found += check_page(page.resolve(), page.read_text(), twophase.__version__)
    if not args.paths:
        found += check_docstrings(REPO / "twophase")
    for problem in found:
        print(problem)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
