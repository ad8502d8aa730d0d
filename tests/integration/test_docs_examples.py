"""The Python examples of the getting-started and guide pages that need no Spark, run as
written against the test servers: each page's examples as one program, with a fresh
staging database and InfluxDB database of its own (tests/docs_examples.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs_examples import PAGES_WITHOUT_SPARK as PAGES
from tests.support import run_page


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_pages_examples_run(
    page: Path, staging_url: str, influx_v1_url: str, tmp_path: Path
) -> None:
    run_page(page, staging_url, influx_v1_url, tmp_path)


def test_pages_without_spark_are_found() -> None:
    assert {"python-api.md", "configuration.md", "targets.md"} <= {p.name for p in PAGES}
