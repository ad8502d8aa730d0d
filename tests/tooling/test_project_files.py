"""What ships: the wheel's package list covers every package folder (the migrations
included, from the top-level folder), and the project carries its license and changelog."""

from __future__ import annotations

import re
import subprocess
import sys

import tomllib

import twophase
from tests.support import REPO

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_the_wheel_lists_every_package_folder() -> None:
    folders = {
        ".".join(path.parent.relative_to(REPO).parts)
        for path in (REPO / "twophase").rglob("__init__.py")
    }
    listed = set(PROJECT["tool"]["setuptools"]["packages"])
    assert listed == folders | {"twophase.migrations"}
    assert PROJECT["tool"]["setuptools"]["package-dir"] == {"twophase.migrations": "migrations"}
    assert (REPO / "migrations" / "__init__.py").is_file()


def test_the_license_is_the_apache_license() -> None:
    text = (REPO / "LICENSE").read_text()
    assert PROJECT["project"]["license"] == "Apache-2.0"
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text


def test_the_changelog_has_this_version_and_its_schema_revision() -> None:
    from twophase.store.database import SCHEMA_REVISION

    text = (REPO / "CHANGELOG.md").read_text()
    releases = re.split(r"^## ", text, flags=re.M)[1:]
    current = next(r for r in releases if r.startswith(f"[{twophase.__version__}]"))
    assert SCHEMA_REVISION in current


def test_user_extras_carry_no_development_tools() -> None:
    extras = PROJECT["project"]["optional-dependencies"]
    tools = {"pytest", "ruff", "mypy", "hypothesis", "build", "matplotlib"}
    for name, requirements in extras.items():
        assert not {re.split(r"[<>=\[ ]", r)[0] for r in requirements} & tools, name


def test_the_compose_image_copies_what_the_package_build_reads() -> None:
    """``pip install .`` in the image reads the readme and license the metadata names and
    the two source folders the wheel is made of."""
    compose = (REPO / "docker-compose.yml").read_text()
    copied = {
        part
        for line in re.findall(r"^\s*COPY (.+)$", compose, flags=re.M)
        for part in line.split()[:-1]
    }
    assert {"pyproject.toml", "README.md", "LICENSE", "twophase", "migrations"} <= copied


def test_ruff_leaves_the_pages_alone_even_named_one_by_one() -> None:
    """``ruff format`` reads a page's Python blocks as Python and mangles a snippet marker
    in one (``--8<-- "path"`` into ``--8 < --"path"``): the pages are excluded, and the
    exclusion holds for a page an editor or a hook names."""
    pages = [str(p.relative_to(REPO)) for p in sorted((REPO / "docs").rglob("*.md"))]
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--diff", *pages],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "--8 <" not in done.stdout
