"""The job's own log lines are not lost under spark-submit: with ``--log-format json``,
twophase's commits are JSON objects naming their sink, epoch and run.

spark-submit runs the driver's Python with its stderr merged into its stdout (Spark's
PythonRunner), so the lines come out on spark-submit's stdout, beside the job's
``STARTED``/``PROGRESS``/``DONE`` lines; Spark's own log4j lines stay on stderr."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from tests.e2e.harness import SINK, SINKS, Target, feed, run_job

SPARK_SUBMIT = Path(sys.executable).with_name("spark-submit")


def twophase_lines(output: str) -> list[dict[str, Any]]:
    """The JSON objects twophase's loggers wrote among the job's other lines."""
    found = []
    for line in output.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and str(record.get("logger", "")).startswith("twophase"):
            found.append(record)
    return found


@pytest.mark.parametrize(
    "writer", [pytest.param("foreach-batch", marks=pytest.mark.full), "data-source"]
)
def test_spark_submit_job_logs_its_commits_as_json(
    target: Target, work: Path, event_files: list[Path], writer: str
) -> None:
    """The data source's commit runs in a Python worker of Spark's, not in the job's
    process: the sink's ``log_format`` option sets up its logging there."""
    feed(work / "input", event_files[:1])
    launcher = [str(SPARK_SUBMIT), "--master", "local[2]"]
    folders = (work / "input", work / "checkpoint", SINK, work / "logs")
    extra = ["--log-format", "json", "--stats-writer", writer]
    job = run_job(target, *folders, launcher=launcher, extra_args=extra)
    assert job.returncode == 0, job.tail()
    (started,) = job.records("STARTED")

    output = job.out.read_text(errors="replace") + job.stderr()
    commits = [
        r
        for r in twophase_lines(output)
        if r["logger"] == "twophase.protocol.promoter" and "committed" in r["message"]
    ]
    assert {r["sink_id"] for r in commits} == set(SINKS), job.tail()  # stats, dead letters
    for record in commits:
        assert record["level"] == "INFO"
        assert isinstance(record["epoch"], int)
        assert record["run_id"] == started["run_id"]
    # JSON only: no twophase line in the text form beside them
    assert " INFO twophase." not in output
    password = make_url(target.staging_url).password
    assert not password or f":{password}@" not in output  # URLs are masked
