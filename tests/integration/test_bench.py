"""The benchmark harness runs as users run it: `python -m bench --quick` against the real
servers writes a results file whose `metrics` hold, per metric, both sides' median,
min and max, the ratio, the target and whether it holds; and it cleans up after itself.

The default run checks the harness on its two cheapest metrics and a skipped Spark
one (about 20 s); the whole quick run (4-5 minutes here, most of it 1M-point epochs
that measure speed rather than correctness) is in --full."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench import roundtrip
from tests.support import REPO, admin_conninfo

METRICS = (
    "throughput",
    "fixed_cost",
    "history",
    "memory",
    "recovery",
    "spark_e2e",
    "scrape",
    "background",
    "spark_raw",
    "roundtrip",
    "stage_memory",
    "relay",
    "staging_scale",
    "freshness",
)
SPARK_METRICS = ("spark_e2e", "spark_raw", "freshness")  # run in full mode (or with --spark)


def bench_databases(url: str) -> list[str]:
    with psycopg.connect(admin_conninfo(url)) as conn:
        rows = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'twophase_bench_%'")
        return [r[0] for r in rows]


def run_bench(
    base_staging_url: str, influx_url: str, out: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    """``python -m bench --quick --out OUT ARGS...``; fails the test unless it exits 0."""
    return run_command(base_staging_url, influx_url, "--quick", "--out", str(out), *args)


def run_command(
    base_staging_url: str, influx_url: str, *args: str, timeout: int = 600
) -> subprocess.CompletedProcess[str]:
    """``python -m bench ARGS...`` against the test servers; fails the test unless it
    exits 0."""
    env = {
        **os.environ,
        "TWOPHASE_STAGING_URL": base_staging_url,
        "TWOPHASE_TARGET_URL": influx_url,
    }
    done = subprocess.run(
        [sys.executable, "-m", "bench", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def assert_measured(metrics: dict[str, Any], name: str) -> None:
    """A metric measured on both sides, with its ratio, target and verdict."""
    metric = metrics[name]
    assert {"unit", "sides", "ratio", "target", "holds"} <= set(metric), name
    assert isinstance(metric["holds"], bool) and metric["ratio"] > 0, name
    assert len(metric["sides"]) == 2, name
    for side in metric["sides"].values():
        assert side["min"] <= side["median"] <= side["max"], (name, side)


def test_a_run_of_some_metrics_writes_them_with_their_targets_and_cleans_up(
    base_staging_url: str, influx_url: str, tmp_path: Path
) -> None:
    """``--only``: the metrics asked for, in order, a Spark one skipped (quick mode),
    no chart without the throughput metric; scratch databases dropped."""
    only = ("fixed_cost", "history", "spark_e2e")
    done = run_bench(base_staging_url, influx_url, tmp_path, "--only", *only)
    (found,) = tmp_path.glob("*.json")
    assert {p.suffix for p in tmp_path.iterdir()} == {".json", ".md"}
    results = json.loads(found.read_text())
    assert results["plan"] == "quick" and results["machine"]["cpus"] >= 1
    metrics = results["metrics"]
    assert tuple(metrics) == only
    assert "skipped" in metrics["spark_e2e"] and metrics["spark_e2e"]["holds"] is None
    for name in ("fixed_cost", "history"):
        assert_measured(metrics, name)
    assert metrics["history"]["gc"]["bounded"] is True
    assert found.stem in done.stdout and "| 3 flat with history |" in done.stdout
    assert (tmp_path / f"{found.stem}.md").read_text() in done.stdout  # the table
    assert bench_databases(base_staging_url) == []  # scratch databases dropped


@pytest.mark.full
def test_quick_mode_writes_every_metric_with_its_target(
    base_staging_url: str, influx_url: str, tmp_path: Path
) -> None:
    done = run_bench(base_staging_url, influx_url, tmp_path)
    (found,) = tmp_path.glob("*.json")
    assert {p.suffix for p in tmp_path.iterdir()} == {".json", ".md", ".png"}
    results = json.loads(found.read_text())
    assert results["plan"] == "quick" and results["machine"]["cpus"] >= 1
    metrics = results["metrics"]
    assert tuple(metrics) == METRICS
    for name in SPARK_METRICS:  # metrics 6 and 9 run in full mode (or with --spark)
        assert "skipped" in metrics[name] and metrics[name]["holds"] is None, name
    for name in (m for m in METRICS if m not in SPARK_METRICS):
        assert_measured(metrics, name)
    sizes = metrics["throughput"]["by_size"]
    assert set(sizes) == {"1000", "10000", "100000", "1000000"}
    assert all(sizes[s]["holds"] is None for s in ("1000", "10000"))  # no target below 100k
    assert metrics["history"]["gc"]["bounded"] is True
    assert metrics["scrape"]["scrapes"] == 1000 and "10000_epochs" in metrics["scrape"]["p95_ms"]
    assert set(metrics["background"]["parts"]) == {
        f"{size} {mode}" for size in ("100k", "1M") for mode in ("background", "inline")
    }
    assert set(metrics["roundtrip"]["parts"]) == {
        f"500k, {link.name}: {side} / {other}" for link, side, other, _ in roundtrip.ROWS
    }
    assert len(roundtrip.ROWS) == 8
    assert {link.name for link, *_ in roundtrip.ROWS} == {"20 ms", "20 ms, 100 Mbit/s"}
    assert found.stem in done.stdout and "| 5 recovery |" in done.stdout  # the table
    assert bench_databases(base_staging_url) == []  # scratch databases dropped


def test_request_size_measures_each_size_on_both_links(
    base_staging_url: str, influx_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "request-size.json"
    chosen = ["--sizes", "500", "1000", "--json", str(out)]
    done = run_command(
        base_staging_url,
        influx_url,
        *["request_size", "--points", "3000", "--repeats", "1", *chosen],
        timeout=300,
    )
    links = json.loads(out.read_text())["links"]
    assert set(links) == {"loopback", "20 ms"}
    for sizes in links.values():
        assert set(sizes) == {"500", "1000"}
        # 4 lanes: each sends its own share of the epoch's chunks in requests of the size
        assert sizes["500"]["requests_per_send"] > sizes["1000"]["requests_per_send"] >= 3
        for size in sizes.values():
            assert size["points_per_s"] > 0 and size["driver_cpu_s_per_million_points"] > 0
    assert "points/request" in done.stdout
