"""The benchmark runs as users run it: ``python -m bench SCENARIO --quick`` against the
real servers writes a results file holding, per case and figure, each side's median,
min and max and each other side's ratio to the reference; and it drops its scratch
databases.

By default: every in-process scenario once (a few seconds each), and ``versions``
against ``HEAD`` (one process per version); the timing read from
a checkpoint is unit-tested. In --full: the pipelines scenario's ``points`` case (two
Spark jobs, one per side), whose checkpoints are read again here, and every pipeline
in its tiny plan (six Spark jobs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench.harness.spark import timing
from bench.scenarios import pipelines
from tests.support import REPO, admin_conninfo

IN_PROCESS = {
    "throughput": ("twophase", "direct", "direct_4"),
    "costs": ("twophase", "direct", "direct_gzip_4"),
    "fanout": ("one_target", "two_targets"),
    "pg_target": ("twophase", "plain"),
}


def bench_databases(url: str) -> list[str]:
    with psycopg.connect(admin_conninfo(url)) as conn:
        rows = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'twophase_bench_%'")
        return [r[0] for r in rows]


def run_bench(base_staging_url: str, influx_url: str, out: Path, *args: str) -> dict[str, Any]:
    """``python -m bench ARGS... --quick --out OUT``: fails the test unless it exits 0;
    the results file it wrote."""
    env = {
        **os.environ,
        "TWOPHASE_STAGING_URL": base_staging_url,
        "TWOPHASE_TARGET_URL": influx_url,
        "PYSPARK_PYTHON": sys.executable,
    }
    done = subprocess.run(
        [sys.executable, "-m", "bench", *args, "--quick", "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (found,) = out.glob(f"{args[0]}-*.json")
    assert found.stem in done.stdout and "| figure |" in done.stdout
    assert (out / f"{found.stem}.md").read_text() in done.stdout
    return dict(json.loads(found.read_text()))


def assert_compared(results: dict[str, Any], sides: tuple[str, ...]) -> None:
    """Every case's figures measured on the reference side, most on every side, each
    other side's ratio to the reference there."""
    assert results["sides"] == list(sides) and results["plan"] == "quick"
    for figures in results["cases"].values():
        assert sum(set(f["sides"]) == set(sides) for f in figures.values()) >= 3
        for name, figure in figures.items():
            assert sides[0] in figure["sides"], name
            for summary in figure["sides"].values():
                assert summary["min"] <= summary["median"] <= summary["max"], name
            others = set(figure["sides"]) - {sides[0]}
            if figure["sides"][sides[0]]["median"] > 0:
                assert set(figure["ratios"]) == others, name
            assert all(r >= 0 for r in figure["ratios"].values()), name


@pytest.mark.parametrize("scenario", sorted(IN_PROCESS))
def test_an_in_process_scenario_compares_its_sides_and_cleans_up(
    scenario: str, base_staging_url: str, influx_url: str, tmp_path: Path
) -> None:
    results = run_bench(base_staging_url, influx_url, tmp_path, scenario, "--repeats", "1")
    assert_compared(results, IN_PROCESS[scenario])
    (case,) = results["cases"].values()
    cpu = [name for name in case if name.startswith(("cpu_client_s", "cpu_postgres_s"))]
    assert len(cpu) == 2 and all(len(case[n]["sides"]) == len(IN_PROCESS[scenario]) for n in cpu)
    assert bench_databases(base_staging_url) == []


def test_the_versions_scenario_compares_a_revision_with_the_working_tree(
    base_staging_url: str, influx_url: str, tmp_path: Path
) -> None:
    """Each version in a process of its own, from its own checkout: one figure per side,
    the ratio new over old, the old checkout and the scratch databases gone after."""
    results = run_bench(
        base_staging_url, influx_url, tmp_path, "versions", "--old", "HEAD", "--repeats", "1"
    )
    assert results["sides"] == ["old", "new"] and results["old"] == "HEAD"
    (case,) = results["cases"].values()
    figure = case["epoch_ms"]
    assert all(figure["sides"][side]["median"] > 0 for side in ("old", "new"))
    assert set(figure["ratios"]) == {"new"} and figure["ratios"]["new"] > 0
    trees = subprocess.run(
        ["git", "worktree", "list"], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert "twophase-bench-" not in trees.stdout
    assert bench_databases(base_staging_url) == []


@pytest.mark.full
def test_a_pipeline_is_timed_from_its_checkpoint(
    base_staging_url: str, influx_url: str, tmp_path: Path
) -> None:
    """Both sides of the one-point-per-row pipeline, one Spark job each: the figures
    are the ones the checkpoints give, a batch per file."""
    work = tmp_path / "work"
    args = ("pipelines", "--only", "points", "--repeats", "1", "--work", str(work))
    results = run_bench(base_staging_url, influx_url, tmp_path, *args)
    assert_compared(results, ("twophase", "plain"))
    figures = results["cases"]["points"]
    files = pipelines.cases(True)["points"]["files"]
    for side in ("twophase", "plain"):
        assert figures["batches"]["sides"][side]["median"] == files
        assert figures["cpu_jvm_s"]["sides"][side]["median"] > 0
        (checkpoint,) = work.glob(f"r*-{side}")
        again = timing(checkpoint, 0.0, 0.0)  # launch and exit at 0: the batches alone
        for name in ("first_batch_s", "steady_batch_s"):
            assert again[name] == figures[name]["sides"][side]["median"], (side, name)
        wall = figures["wall_s"]["sides"][side]["median"]
        parts = ("startup_s", "first_batch_s", "tail_s")
        assert sum(figures[p]["sides"][side]["median"] for p in parts) <= wall + 0.01
    assert results["headline"][0] == "wall_s"
    assert bench_databases(base_staging_url) == []


@pytest.mark.full
def test_every_pipeline_runs_in_its_tiny_plan(
    base_staging_url: str, influx_url: str, tmp_path: Path
) -> None:
    results = run_bench(base_staging_url, influx_url, tmp_path, "pipelines", "--repeats", "1")
    assert_compared(results, ("twophase", "plain"))
    assert set(results["cases"]) == {"points", "points_source", "sessions", "points_pg"}
    assert (tmp_path / f"pipelines-{results['started']}.png").is_file()
