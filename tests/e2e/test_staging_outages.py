"""PostgreSQL restarted under a running Spark job, while a task stages (fast shutdown)
and while the driver decides (immediate shutdown): the same job process carries on,
finishes, and InfluxDB holds exactly what the input makes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.services import PostgresServer
from tests.e2e.harness import (
    SINK,
    Job,
    Target,
    arm,
    epochs,
    fired,
    mismatches,
    start_job,
)
from tests.support import alembic, free_port, unique
from twophase.config import InfluxConfig

FILES = 6
SECRET = f"Outage-{uuid.uuid4().hex}"  # the staging password: must appear in no output
PAUSE_S = 8.0  # the paused step's process sleeps this long; the restart fits inside


@pytest.fixture
def private_postgres(tmp_path: Path) -> Iterator[PostgresServer]:
    server = PostgresServer(tmp_path / "pg", free_port())
    server.start()
    yield server
    server.destroy()


def restart_when_paused(job: Job, plan: Path, server: PostgresServer, mode: str) -> None:
    job.wait_for("the paused step", fired(plan).exists)
    server.stop(mode=mode)  # the paused step's transaction dies with its connection
    server.start()


def test_postgres_restarts_while_staging_and_deciding_do_not_fail_the_job(
    private_postgres: PostgresServer,
    influx: InfluxConfig,
    event_files: list[Path],
    work: Path,
) -> None:
    name = unique("e2e_outage")
    private_postgres.create_database(name)
    private_postgres.set_password(SECRET)
    url = private_postgres.url_for(name)
    assert alembic("upgrade", "head", url=url).returncode == 0
    files = event_files[:FILES]
    input_dir = work / "input"
    input_dir.mkdir()
    for source in files:
        (input_dir / source.name).write_bytes(source.read_bytes())
    plan = work / "plan.json"
    arm(plan, "in_stage:1", sink=SINK, pause_s=PAUSE_S)
    job = start_job(
        Target(url, influx),
        input_dir,
        work / "checkpoint",
        SINK,
        work / "logs",
        crash_plan=plan,
        TWOPHASE_STAGING_CONNECT_TIMEOUT="2s",
        TWOPHASE_STAGING_RETRY_DEADLINE="60s",
    )
    restart_when_paused(job, plan, private_postgres, "fast")
    arm(plan, "in_decide:1", sink=SINK, pause_s=PAUSE_S)
    restart_when_paused(job, plan, private_postgres, "immediate")
    assert job.wait() == 0, job.tail()
    assert mismatches(influx, files) == []
    stats = epochs(url, SINK)
    assert {e["state"] for e in stats} == {"COMMITTED"}
    assert [e["replays"] for e in stats] == [0] * len(stats)  # no batch ran twice
    assert "decide failed (attempt 1)" in job.stderr(), job.tail()  # ridden out, not lucky
    assert SECRET not in job.stderr() + job.out.read_text()  # the failures named the store
