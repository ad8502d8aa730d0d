"""The performance page of the documentation site (docs/performance.md) quotes the costs
run its sections name (its chart and figures, checked against its results file) and holds
the pipelines' table in the shape the report writes it; the bench's README has a row
for every scenario, each run through the one command."""

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
# Rows of whole Spark pipelines, which the pipelines scenario's run on the page supersedes.
SUPERSEDED = ("vs plain foreachBatch", "seeds' job")


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
        if any(mode in row["metric"] for mode in (*REMOVED, *SUPERSEDED)):
            continue
        if row["ratio"] is not None and "CPU" not in row["metric"]:
            assert f"{row['ratio']:.2f}x" in page, row["metric"]
        first = row["figure"].split(";")[0]
        for figure in re.findall(r"\d{1,3}(?:,\d{3})+|\d+\.\d+", first):
            assert figure in page, (row["metric"], figure)


def test_the_pages_pipelines_table_is_the_latest_run() -> None:
    """The page names the latest committed run of the pipelines scenario, and shows
    each of its pipelines' ratios of the total, the first and the steady micro-batch
    as that run's results file has them."""
    latest = sorted(RESULTS.glob("pipelines-*.json"))[-1]
    run = json.loads(latest.read_text())
    page = PERFORMANCE.read_text()
    assert f"bench/results/{latest.stem}.md" in page
    assert run["plan"] == "full"
    assert set(run["cases"]) == {"points", "points_source", "sessions", "points_pg"}
    for case, figures in run["cases"].items():
        shown = [line for line in page.splitlines() if line.startswith(f"| {case} |")]
        for name in ("wall_s", "first_batch_s", "steady_batch_s"):
            ratio = figures[name]["ratios"]["plain"]
            assert any(line.endswith(f"| {ratio:.2f} |") for line in shown), (case, name)
    assert "python -m bench pipelines" in page


def test_every_scenario_has_a_readme_row_and_runs_through_the_one_command() -> None:
    """No servers: each scenario loads, has a row in bench/README.md, and the pages show
    it run as ``python -m bench SCENARIO`` (not as a module of its own)."""
    from bench.harness.cli import SCENARIOS, load

    readme = (REPO / "bench" / "README.md").read_text()
    pages = [REPO / "README.md", REPO / "bench" / "README.md", *(REPO / "docs").rglob("*.md")]
    text = "\n".join(page.read_text() for page in pages)
    for name in SCENARIOS:
        assert load(name).name == name
        assert f"| `{name}` |" in readme, name
        assert not re.search(rf"python -m bench\.{name}\b", text), name
    assert "python -m bench pipelines" in readme
