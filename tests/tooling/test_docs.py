"""The documentation site without building it: every command the pages show parses, every
setting and command is in the generated reference, every page the navigation names exists.
(`mkdocs build --strict` in scripts/dev.sh test checks links and references.)"""

from __future__ import annotations

import re

import pytest

from scripts import docs_reference
from tests.docs_examples import DOCS, EXAMPLE_PAGES, SITE_PAGES, blocks, twophase_commands
from tests.support import REPO
from twophase.cli import build_parser
from twophase.config import SETTINGS

pytestmark = pytest.mark.unit

MKDOCS = (REPO / "mkdocs.yml").read_text()


@pytest.mark.parametrize("page,argv", twophase_commands(), ids=lambda v: str(v))
def test_every_command_the_pages_show_parses(page: str, argv: list[str]) -> None:
    parsed = build_parser().parse_args(argv)
    assert parsed.handler


def test_the_pages_show_commands() -> None:
    assert len(twophase_commands()) >= 30


def test_every_command_is_in_the_cli_reference() -> None:
    reference = docs_reference.cli()
    paths = [path for path, _ in docs_reference.commands()]
    assert "twophase targets" in paths and "twophase db upgrade" in paths
    assert [p for p in paths if f"`{p}`" not in reference] == []
    for _, parser in docs_reference.commands():
        flags = [f for a in parser._actions for f in a.option_strings if f.startswith("--")]
        flags.remove("--help")
        assert [f for f in flags if f"`{f}" not in reference] == [], parser.prog


def test_every_setting_has_its_row() -> None:
    reference = docs_reference.settings()
    for setting in SETTINGS:
        assert f"| `{setting.name}` | `{setting.env}` |" in reference, setting.name


def test_every_marker_names_a_generator() -> None:
    for page in SITE_PAGES:
        for name in docs_reference.MARKER.findall(page.read_text()):
            assert name in docs_reference.GENERATORS, (page, name)


def test_every_generator_runs() -> None:
    for name, generate in docs_reference.GENERATORS.items():
        assert generate().strip(), name


def test_every_page_in_the_navigation_exists() -> None:
    pages = re.findall(r":\s+([\w/.-]+\.md)\s*$", MKDOCS, flags=re.M)
    generated = {"bench/index.md"}
    missing = [p for p in pages if p not in generated and not (DOCS / p).is_file()]
    assert missing == []
    written = {str(p.relative_to(DOCS)) for p in SITE_PAGES}
    assert written <= set(pages), sorted(written - set(pages))


def test_every_schema_table_is_in_the_reference() -> None:
    from twophase.store.schema import metadata

    reference = docs_reference.schema()
    assert [t.name for t in metadata.sorted_tables if f"### `{t.name}`" not in reference] == []


def test_the_example_pages_have_python_examples() -> None:
    with_python = [page.name for page in EXAMPLE_PAGES if blocks(page, "python")]
    assert {"data-source.md", "foreach-batch.md", "python-api.md"} <= set(with_python)


def test_the_readme_is_short_and_starts_with_what_twophase_is() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 150
    lead = "Exactly-once delivery from Spark Structured Streaming into InfluxDB, PostgreSQL"
    assert lead in lines[2]
    head = "\n".join(lines[:10])
    assert "scripts/dev.sh demo" in head and "scripts/dev.sh test" in head


def test_the_pages_name_this_versions_wheel() -> None:
    """An install command names the wheel the build makes: this version's."""
    import twophase

    pages = [REPO / "README.md", *SITE_PAGES]
    named = {
        m for page in pages for m in re.findall(r"twophase-(\d+\.\d+\.\d+)-py3", page.read_text())
    }
    assert named <= {twophase.__version__}, named


def test_every_metric_in_the_reference_has_a_meaning() -> None:
    rows = [line for line in docs_reference.metrics().splitlines() if line.startswith("| `")]
    assert rows
    blank = [row.split("|")[1].strip() for row in rows if row.rstrip().endswith("|  |")]
    assert blank == []
