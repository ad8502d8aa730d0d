"""The Python examples of the getting-started and guide pages that need Spark, run as
written on a local Spark against the test servers, over a small stream of events the
prelude of tests/docs_examples.py makes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs_examples import KAFKA_MALFORMED, KAFKA_RECORDS
from tests.docs_examples import PAGES_WITH_SPARK as PAGES
from tests.support import run_page

# What a page's last example prints when InfluxDB and the dead-letter table hold exactly
# what the page's input makes.
PRINTS = {
    "quickstart.md": ["default 300 points: ok"],
    "kafka.md": [
        f"telemetry: {KAFKA_RECORDS} points, ok",
        f"telemetry.malformed: {len(KAFKA_MALFORMED)}",
    ],
}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_pages_spark_examples_run(
    page: Path, staging_url: str, influx_v1_url: str, tmp_path: Path
) -> None:
    printed = run_page(page, staging_url, influx_v1_url, tmp_path).splitlines()
    for line in PRINTS.get(page.name, []):
        assert line in printed, (page.name, printed)


def test_pages_with_spark_are_found() -> None:
    names = {p.name for p in PAGES}
    assert {"data-source.md", "foreach-batch.md", "promotion.md", "dead-letters.md"} <= names
    assert set(PRINTS) <= names
