"""``bench.costs``'s pure helpers, without servers or Spark: its input, the in-process
staging batches, the profile summary, and the table's rows."""

from __future__ import annotations

import cProfile
from pathlib import Path
from typing import Any

from bench import costs_report
from bench.costs_core import SPEC, csv_batches
from bench.costs_spark import csv_line, profile_summary, write_csv
from bench.encode import by_rows, columnar


def test_every_csv_row_is_a_distinct_point(tmp_path: Path) -> None:
    paths = write_csv(tmp_path / "in", 100, 3)
    lines = [line for path in paths for line in path.read_text().splitlines()[1:]]
    assert len(lines) == 300
    assert len({(x.split(",")[0], x.split(",")[1]) for x in lines}) == 300
    assert lines[0] == csv_line(0).rstrip("\n")


def test_both_encoders_give_the_same_lines_on_the_csv_batches() -> None:
    batches = csv_batches(25_000)
    assert [b.num_rows for b in batches] == [10_000, 10_000, 5_000]
    items = columnar(SPEC, batches[0])
    assert items == by_rows(SPEC, batches[0])
    assert items[0] == "host_stats,host=web-0,region=eu-west cpu=0,mem=0i,requests=0i " + str(
        int(csv_line(0).split(",")[0]) * 1_000_000
    )


def _work(n: int) -> int:
    return sum(range(n))


def test_profile_summary_divides_each_step_by_the_calls(tmp_path: Path) -> None:
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(4):
        _work(10_000)
    profile.disable()
    path = tmp_path / "p.prof"
    profile.dump_stats(str(path))
    summary = profile_summary(path, (("work", "test_bench_costs", "_work"),))
    assert summary["calls"] == 4
    assert summary["steps_ms_per_batch"]["work"] >= 0
    assert summary["top_cumulative"]


def _run(wall: float, cpu: dict[str, float]) -> dict[str, Any]:
    return {"wall_s": wall, "steady_ms": 100.0, "cpu_s_per_million": cpu}


def test_rows_compare_with_the_plain_side_and_the_base_without_a_writer() -> None:
    cpu = {"driver": 1.0, "jvm": 10.0, "workers": 0.0, "postgres": 0.0, "influxd": 5.0}
    runs = {
        "plain": [_run(33.0, {**cpu, "workers": 4.0})],
        "twophase": [_run(30.0, {**cpu, "workers": 2.0, "postgres": 1.0})],
        "noop": [_run(20.0, cpu)],
    }
    parts = {"csv": {"runs": runs, "batches": 12, "rows_per_batch": 25_000, "points": 1}}
    table = costs_report.rows(parts)
    first, added = table[0], next(r for r in table if r["metric"].startswith("5 "))
    assert first["ratio"] == 1.1 and first["holds"] is True
    assert added["ratio"] == 0.75 and added["holds"] is True
    assert [r["figure"] for r in table if r["metric"].startswith("3 ")] == ["not run"]
    assert [int(r["metric"].split()[0]) for r in table] == sorted(
        int(r["metric"].split()[0]) for r in table
    )
