"""The Python examples of the getting-started and guide pages that need no Spark, run as
written against the test servers: each page's examples as one program, with a fresh
staging database and InfluxDB database of its own (tests/docs_examples.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_examples import EXAMPLE_PAGES, needs_spark, program
from tests.support import (
    create_influx_database,
    create_migrated_database,
    drop_database,
    drop_influx_database,
    unique,
)

PAGES = [page for page in EXAMPLE_PAGES if (code := program(page)) and not needs_spark(code)]


def run_page(page: Path, staging_url: str, influx_url: str, tmp_path: Path) -> str:
    name = unique("docs")
    url = create_migrated_database(staging_url, name)
    create_influx_database(influx_url, name)
    env = {
        **os.environ,
        "TWOPHASE_STAGING_URL": url,
        "TWOPHASE_INFLUX_URL": influx_url,
        "TWOPHASE_INFLUX_API": "v1",
        "TWOPHASE_INFLUX_DB": name,
        "PYSPARK_PYTHON": sys.executable,
    }
    env.pop("TWOPHASE_CONFIG", None)
    script = tmp_path / f"{page.stem}.py"
    script.write_text(program(page) or "")
    try:
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        drop_database(staging_url, name)
        drop_influx_database(influx_url, name)
    assert done.returncode == 0, f"{page.name}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_pages_examples_run(
    page: Path, staging_url: str, influx_v1_url: str, tmp_path: Path
) -> None:
    run_page(page, staging_url, influx_v1_url, tmp_path)


def test_pages_without_spark_are_found() -> None:
    assert {"python-api.md", "configuration.md", "targets.md"} <= {p.name for p in PAGES}
