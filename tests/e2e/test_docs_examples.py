"""The Python examples of the getting-started and guide pages that need Spark, run as
written on a local Spark against the test servers, over a small stream of events the
prelude of tests/docs_examples.py makes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs_examples import EXAMPLE_PAGES, needs_spark, program
from tests.integration.test_docs_examples import run_page

PAGES = [page for page in EXAMPLE_PAGES if (code := program(page)) and needs_spark(code)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_pages_spark_examples_run(
    page: Path, staging_url: str, influx_v1_url: str, tmp_path: Path
) -> None:
    run_page(page, staging_url, influx_v1_url, tmp_path)


def test_pages_with_spark_are_found() -> None:
    names = {p.name for p in PAGES}
    assert {"data-source.md", "foreach-batch.md", "promotion.md", "dead-letters.md"} <= names
