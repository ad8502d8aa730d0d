"""The performance page of the documentation site (docs/performance.md) quotes the latest
quick benchmark run: the command, the run's table (checked against its results file), its
chart, its date and machine."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.support import REPO

RESULTS = REPO / "bench" / "results"
PERFORMANCE = REPO / "docs" / "performance.md"


def benchmark_section() -> str:
    text = PERFORMANCE.read_text()
    return text[text.index("## Benchmarks") :]


def quick_runs() -> list[Path]:
    runs = RESULTS.glob("*.json")  # the soak's reports (no plan) sit beside them
    return sorted(p for p in runs if json.loads(p.read_text()).get("plan") == "quick")


def test_readme_quotes_the_quick_command_and_the_latest_quick_run() -> None:
    section = benchmark_section()
    assert "python -m bench --quick" in section
    stamps = set(re.findall(r"\d{8}T\d{6}Z", section))
    latest = quick_runs()[-1]
    assert latest.stem in stamps, f"the page does not quote the latest quick run {latest.stem}"
    assert f"](bench/results/{latest.stem}.png)" in section
    assert (RESULTS / f"{latest.stem}.png").is_file()
    results = json.loads(latest.read_text())
    day = f"{latest.stem[:4]}-{latest.stem[4:6]}-{latest.stem[6:8]}"
    assert day in section and f"{results['machine']['cpus']}-core" in section


def test_readme_table_matches_the_results_file() -> None:
    section = benchmark_section()
    metrics = json.loads(quick_runs()[-1].read_text())["metrics"]
    rows = {
        "throughput, 100k-point epochs": metrics["throughput"]["by_size"]["100000"],
        "throughput, 1M-point epochs": metrics["throughput"]["by_size"]["1000000"],
        "flat with history": metrics["history"],
        "recovery": metrics["recovery"],
    }
    for label, metric in rows.items():
        line = next(x for x in section.splitlines() if x.startswith(f"| {label}"))
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[3] == f"{metric['ratio']:.2f}", (label, cells)
        assert cells[5] == ("yes" if metric["holds"] else "no"), (label, cells)


def test_readme_shows_the_spark_chart_drawn_from_the_quoted_full_run(tmp_path: Path) -> None:
    """Metric 6's chart is drawn from the results file the README quotes; a run without
    Spark figures draws none."""
    from bench import report

    text = PERFORMANCE.read_text()
    (stamp,) = set(re.findall(r"\(bench/results/(\d{8}T\d{6}Z)-spark\.png\)", text))
    results = json.loads((RESULTS / f"{stamp}.json").read_text())
    assert results["metrics"]["spark_e2e"]["parts"]
    assert report.spark_chart(results, tmp_path / "spark.png")
    assert (tmp_path / "spark.png").read_bytes()[:4] == b"\x89PNG"
    assert (RESULTS / f"{stamp}-spark.png").is_file()
    quick = json.loads(quick_runs()[-1].read_text())
    assert not report.spark_chart(quick, tmp_path / "none.png")


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
