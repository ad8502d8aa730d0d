"""The bench harness's pure parts, without servers or Spark: the checkpoint timing,
the rotation of sides, the summaries and ratios, the report; and the plain pipelines'
line protocol, read back by twophase's parser, is the points the input holds."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bench.harness import report
from bench.harness.scenario import Scenario, summarise
from bench.harness.sides import BenchError
from bench.harness.spark import timing
from bench.harness.stats import rotated
from bench.jobs import plain_points
from bench.scenarios import pipelines
from twophase.points.lineproto import ParsedPoint, parse_line

LAUNCH = 1_000_000.0


def checkpoint(tmp_path: Path, batches: dict[int, tuple[float, float]]) -> Path:
    """A query checkpoint whose ``offsets/N`` and ``commits/N`` have the given mtimes."""
    for folder in ("offsets", "commits"):
        (tmp_path / folder).mkdir()
    for n, (planned, done) in batches.items():
        for folder, at in (("offsets", planned), ("commits", done)):
            path = tmp_path / folder / str(n)
            path.write_text("v1\n")
            os.utime(path, (LAUNCH + at, LAUNCH + at))
    (tmp_path / "offsets" / ".0.crc").write_text("")  # Spark's checksum files are skipped
    return tmp_path


def test_timing_reads_the_phases_from_the_checkpoint(tmp_path: Path) -> None:
    found = checkpoint(tmp_path, {0: (10, 14), 1: (14, 15), 2: (15, 17), 3: (17, 18.5)})
    assert timing(found, LAUNCH, LAUNCH + 20) == {
        "wall_s": 20.0,
        "startup_s": 10.0,
        "first_batch_s": 4.0,
        "steady_batch_s": 1.5,  # median of 1, 2, 1.5
        "tail_s": 1.5,
        "batches": 4.0,
    }


def test_timing_of_one_batch_has_no_steady_batch(tmp_path: Path) -> None:
    found = checkpoint(tmp_path, {0: (3, 5)})
    assert timing(found, LAUNCH, LAUNCH + 6)["steady_batch_s"] == 0.0


def test_timing_refuses_a_run_without_a_committed_first_batch(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="no committed batch 0"):
        timing(checkpoint(tmp_path, {}), LAUNCH, LAUNCH + 1)


def test_sides_run_in_rotated_order() -> None:
    order: list[tuple[str, int]] = []
    rotated(3, ("a", "b", "c"), lambda side, r: order.append((side, r)))
    assert [side for side, _ in order] == list("abcbcacab")


def test_ratios_are_the_other_sides_median_over_the_references() -> None:
    scenario = Scenario("s", "about", ("tp", "plain"), lambda quick: {}, lambda *a: {})
    values = {"tp": {"wall_s": [2.0, 4.0, 3.0]}, "plain": {"wall_s": [6.0, 6.0, 9.0]}}
    figure = summarise(scenario, values)["wall_s"]
    assert figure["ratios"] == {"plain": 2.0}
    assert figure["sides"]["tp"]["median"] == 3.0 and figure["sides"]["tp"]["n"] == 3


def results() -> dict[str, Any]:
    one = {"sides": {"twophase": {"median": 2.0, "min": 2.0, "max": 2.0, "n": 1}}}
    one["sides"]["plain"] = {"median": 3.0, "min": 3.0, "max": 3.0, "n": 1}
    return {
        "scenario": "pipelines",
        "about": "about",
        "started": "20260101T000000Z",
        "plan": "quick",
        "repeats": 1,
        "machine": {"cpus": 2, "load_average_at_start": [0.1]},
        "sides": ["twophase", "plain"],
        "cases": {"points": {"wall_s": one | {"ratios": {"plain": 1.5}}}},
        "notes": ["a note"],
        "headline": ["wall_s"],
    }


def test_the_report_has_the_headline_a_table_per_case_and_the_notes() -> None:
    text = report.markdown(results())
    assert "| case | figure | twophase | plain | plain / twophase |" in text
    assert "| points | wall_s | 2.000 | 3.000 | 1.50 |" in text
    assert "## points" in text and "| wall_s | 2.000 | 3.000 | 1.50 |" in text
    assert "* a note" in text


def test_the_report_writes_json_markdown_and_chart(tmp_path: Path) -> None:
    path = report.write(results(), tmp_path)
    assert path.name == "pipelines-20260101T000000Z.json"
    assert {p.suffix for p in tmp_path.iterdir()} >= {".json", ".md"}


def test_the_plain_writers_lines_are_the_inputs_points() -> None:
    """The plain pipeline escapes tags and strings by hand: read back by twophase's
    parser, each line is its row's point, hostile tags and all."""
    for i in range(len(pipelines.HOSTS) * len(pipelines.REGIONS)):
        stamp, host, region, cpu, requests, healthy, status = pipelines.row(i)
        at = datetime.strptime(str(stamp), "%Y-%m-%dT%H:%M:%S.%fZ")  # naive UTC, as Spark's
        spark_row = SimpleNamespace(
            time=at,
            host=host,
            region=region,
            cpu=cpu,
            requests=requests,
            healthy=healthy == "true",
            status=status,
        )
        parsed = parse_line(plain_points.line(spark_row))
        fields = {"cpu": cpu, "requests": requests, "healthy": healthy == "true"}
        expected_ns = (int(pipelines.START.timestamp()) * 1000 + i) * 1_000_000
        assert parsed == ParsedPoint(
            "host_stats",
            (("host", host), ("region", region)),
            fields | {"status": status},
            expected_ns,
        )


def test_the_plain_jobs_import_nothing_of_twophase() -> None:
    """The plain side is what a user writes without twophase: none of its code."""
    import ast

    from tests.support import REPO

    jobs = REPO / "bench" / "jobs"
    for path in [jobs / "common.py", *jobs.glob("plain_*.py")]:
        tree = ast.parse(path.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [n for n in names if n.split(".")[0] in ("twophase", "jobs")], path
