"""``bench.pg_target``'s pure helpers, without servers or Spark: its options, the jobs'
environment, a run's figures, the rows and the Markdown."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from bench import pg_target, pg_target_report
from bench.pg_target import Plan, Target, figures, parse, plan_of, target_env
from bench.pg_target_job import Steps
from bench.spark_runs import Run


def test_options_make_the_plan() -> None:
    assert plan_of(parse([])) == pg_target.FULL_PLAN
    assert plan_of(parse(["--quick"])) == pg_target.QUICK_PLAN
    custom = plan_of(parse(["--sizes", "2000,4000", "--epochs", "2", "--reps", "1"]))
    assert custom == Plan("custom", (2000, 4000), 2, 1)
    assert custom.steady_after == 1
    with pytest.raises(SystemExit):
        parse(["--epochs", "1"])  # no epoch would be counted


def test_the_jobs_write_to_the_postgresql_target_and_to_no_influxdb(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TWOPHASE_INFLUX_DB", "twophase")
    monkeypatch.setenv("TWOPHASE_TARGETS", "a=http://x:8086")
    target = Target("postgresql://u@127.0.0.1:5432/t1", "pw", "t1")
    env = target_env("postgresql+psycopg://u:pw@127.0.0.1:5432/s1", target)
    assert env["TWOPHASE_TARGET_URL"] == target.url
    assert env["TWOPHASE_TARGET_KIND"] == "postgresql"
    assert env["TWOPHASE_TARGET_CREATE_TABLES"] == "true"
    assert env["TWOPHASE_TARGET_PASSWORD"] == env["PGPASSWORD"] == "pw"
    assert env["TWOPHASE_STAGING_URL"].endswith("/s1")
    assert "TWOPHASE_INFLUX_DB" not in env and "TWOPHASE_TARGETS" not in env
    assert "TWOPHASE_STAGING_URL" not in target_env(None, target)


def test_the_steps_handler_keeps_each_commit_records_steps() -> None:
    steps = Steps()
    log = logging.getLogger("test_bench_pg_target")
    log.addHandler(steps)
    log.setLevel(logging.INFO)
    try:
        log.info("epoch 0", extra={"steps_ms": {"stage": 5.0, "promote": 2.0}})
        log.info("no steps here")
    finally:
        log.removeHandler(steps)
    assert steps.record() == {"steps_ms": [{"stage": 5.0, "promote": 2.0}]}


def _run(points_per_s: float, wall: float, stages: dict[str, Any]) -> dict[str, Any]:
    run = Run(wall, 10.0, 100.0, points_per_s, {"STAGES": stages, "CPU": {"driver": 2.0}})
    return figures(run, {"driver": 2.0, "target_pg": 1.0}, 2_000_000, steady_after=1)


def _part() -> dict[str, Any]:
    steps = [
        {"decide": 9.0, "promote": 50.0, "recover": 0.0, "stage": 30.0},  # batch 0: warm-up
        {"decide": 1.0, "promote": 20.0, "recover": 0.0, "stage": 10.0},
        {"decide": 3.0, "promote": 40.0, "recover": 0.0, "stage": 30.0},
    ]
    plain = {"partitions_s": 3.0, "execute_s": 1.5}
    return {
        "points_per_epoch": 1000,
        "epochs": 3,
        "runs": {
            "twophase": [_run(90_000, 20.0, {"steps_ms": steps})],
            "plain": [_run(100_000, 21.0, plain), _run(80_000, 23.0, plain)],
        },
    }


def test_figures_keep_the_steady_epochs_and_divide_cpu_by_the_points() -> None:
    run = _part()["runs"]["twophase"][0]
    assert len(run["stages"]["steps_ms"]) == 2
    assert run["cpu_s_per_million"] == {"driver": 1.0, "target_pg": 0.5}
    assert run["steady_points_per_s"] == 90_000


def test_rows_divide_twophase_by_plain_per_size() -> None:
    (row,) = pg_target_report.rows({"1000": _part()})
    assert (row["twophase_points_per_s"], row["plain_points_per_s"]) == (90_000, 90_000)
    assert row["ratio"] == 1.0 and row["holds"] is True
    slow = _part()
    slow["runs"]["twophase"][0]["steady_points_per_s"] = 80_000
    (row,) = pg_target_report.rows({"1000": slow})
    assert row["ratio"] == 0.889 and row["holds"] is False


def test_steps_are_medians_over_the_steady_epochs_in_the_commits_order() -> None:
    part = _part()
    assert pg_target_report.steps(part) == {
        "stage": 20.0,
        "recover": 0.0,
        "decide": 2.0,
        "promote": 30.0,
    }
    assert pg_target_report.plain_stages(part) == {
        "partitions (rows to Python, convert, upsert)": 1000.0,
        "of which executemany": 500.0,
    }


def test_markdown_has_the_ratio_the_steps_and_the_cpu() -> None:
    sizes = {"1000": _part()}
    results = {
        "started": "20261127T000000Z",
        "plan": "pg-target-custom",
        "seconds": 1.0,
        "settings": {"sizes": [1000], "epochs": 3, "reps": 1},
        "machine": {"cpus": 2, "cpu": "x", "load_average_at_start": [0.1]},
        "sizes": sizes,
        "rows": pg_target_report.rows(sizes),
    }
    text = pg_target_report.markdown(results)
    assert "| 1,000 | 90,000 | 90,000 | 1.0 | >= 0.9x plain | yes | 20.0 / 22.0 |" in text
    assert "| 1,000 | twophase | promote | 30 |" in text
    assert "| 1,000 | twophase | rest of the micro-batch | 48 |" in text
    assert "| 1,000 | plain | of which executemany (task-ms) | 500 |" in text
