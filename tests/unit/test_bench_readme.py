"""The performance page of the documentation site (docs/performance.md) quotes the latest
full run of ``python -m bench costs``: its command, its chart and its figures, checked
against its results file; and the bench's README has a row for every metric."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.support import REPO

RESULTS = REPO / "bench" / "results"
PERFORMANCE = REPO / "docs" / "performance.md"
# Rows of a run that measured a mode since removed (promotion = overlap): the results file
# keeps them, the page does not quote them.
REMOVED = ("overlap",)


def costs_runs() -> list[Path]:
    runs = RESULTS.glob("costs-*.json")
    return sorted(p for p in runs if json.loads(p.read_text()).get("plan") == "costs-full")


def test_the_page_quotes_the_command_and_the_latest_full_costs_run() -> None:
    page = PERFORMANCE.read_text()
    assert "python -m bench costs" in page
    latest = costs_runs()[-1]
    assert f"bench/results/{latest.stem}.json" in page
    assert f"](bench/results/{latest.stem}.png)" in page
    assert (RESULTS / f"{latest.stem}.png").is_file()
    cores = json.loads(latest.read_text())["machine"]["cpus"]
    assert f"{cores} cores" in page


def test_the_pages_ratios_are_the_runs() -> None:
    """Each ratio the run measured, as the page rounds it (``1.02x``), is on the page, and
    so are the figures of each row's first clause (``14.3``, ``326,884``), but for a
    removed mode's rows."""
    page = PERFORMANCE.read_text()
    rows = json.loads(costs_runs()[-1].read_text())["rows"]
    for row in rows:
        if any(mode in row["metric"] for mode in REMOVED):
            continue
        if row["ratio"] is not None and "CPU" not in row["metric"]:
            assert f"{row['ratio']:.2f}x" in page, row["metric"]
        first = row["figure"].split(";")[0]
        for figure in re.findall(r"\d{1,3}(?:,\d{3})+|\d+\.\d+", first):
            assert figure in page, (row["metric"], figure)


def test_every_metric_has_a_title_and_a_readme_row() -> None:
    """No servers: each of the bench's metrics has its numbered title in the table and its
    row in bench/README.md, and the Spark ones run only with --spark."""
    from bench import __main__ as bench_main
    from bench import report

    assert bench_main.SPARK_METRICS == ("spark_e2e", "spark_raw", "freshness")
    assert set(bench_main.SPARK_METRICS) <= set(bench_main.METRICS)
    rows = (REPO / "bench" / "README.md").read_text().splitlines()
    for name in bench_main.METRICS:
        number = report.TITLES[name].split()[0]
        assert any(row.startswith(f"| {number} | ") for row in rows), (name, number)


def test_every_part_runs_through_the_one_command() -> None:
    """No servers: each part of ``python -m bench PART`` is a module with a ``main``, and
    the pages show it run that one way (not as ``python -m bench.PART``)."""
    import importlib

    from bench import __main__ as bench_main

    pages = [REPO / "README.md", REPO / "bench" / "README.md", *(REPO / "docs").rglob("*.md")]
    text = "\n".join(page.read_text() for page in pages)
    for name in bench_main.PARTS:
        assert callable(importlib.import_module(f"bench.{name}").main), name
        assert f"python -m bench {name}" in text, name
        assert not re.search(rf"python -m bench\.{name}\b", text), name
