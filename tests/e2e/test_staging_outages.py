"""PostgreSQL faults under a running Spark job on ``local[2]`` (no task retries): nine
fast and immediate restarts and terminated backends, a few seconds apart, while tasks
stage (mid-COPY and at the write's record), while the driver decides and while it
marks. The same job process carries on, finishes, and InfluxDB holds exactly what the
input makes: no fault may cost a task, since none is retried."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit import PostgresServer
from devkit.ports import free_port
from tests.e2e.harness import SINK, Target, arm, disarm, epochs, fired, mismatches, start_job
from tests.staging import terminate_others
from tests.support import alembic, unique
from twophase.config import TargetConfig

FILES = 12
SECRET = f"Outage-{uuid.uuid4().hex}"  # the staging password: must appear in no output
PAUSE_S = 5.0  # the paused step's process sleeps this long; the fault lands inside
# (step paused at, fault): each step meets each kind of fault once. The staging points
# fire in the Python workers of the tasks, the others in the driver.
FAULTS = [
    ("stage_rows:1", "fast"),  # mid-COPY: repeated from the task's spool
    ("in_decide:1", "immediate"),  # the vote written, not committed
    ("in_mark:1", "terminate"),  # delivered, COMMITTED written, not committed
    ("in_stage:1", "immediate"),  # the write recorded, not committed
    ("in_decide:1", "terminate"),
    ("in_mark:1", "fast"),
    ("stage_rows:1", "terminate"),
    ("in_stage:1", "fast"),
    ("in_mark:1", "immediate"),
]


@pytest.fixture
def private_postgres(tmp_path: Path) -> Iterator[PostgresServer]:
    server = PostgresServer(tmp_path / "pg", free_port())
    server.start()
    yield server
    server.destroy()


def fault(server: PostgresServer, url: str, kind: str) -> None:
    """Restart the server (``fast``: sessions ended, a checkpoint; ``immediate``: as a
    crash, recovery at start), or end every backend of the database (``terminate``)."""
    if kind == "terminate":
        assert terminate_others(url) >= 1  # the paused step's connection at least
        return
    server.stop(mode=kind)
    server.start()


def test_nine_postgres_faults_on_local2_do_not_fail_the_job(
    private_postgres: PostgresServer,
    influx: TargetConfig,
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
    arm(plan, FAULTS[0][0], sink=SINK, pause_s=PAUSE_S)
    job = start_job(
        Target(url, influx),
        input_dir,
        work / "checkpoint",
        SINK,
        work / "logs",
        master="local[2]",  # one failed task would fail the query
        crash_plan=plan,
        TWOPHASE_STAGING_CONNECT_TIMEOUT="2s",
        TWOPHASE_STAGING_RETRY_DEADLINE="60s",
    )
    for number, (_, kind) in enumerate(FAULTS):
        job.wait_for(f"the paused step of fault {number + 1}", fired(plan).exists)
        fault(private_postgres, url, kind)
        # Done while the step still slept in its open transaction: it met the fault.
        landed = time.time() - fired(plan).stat().st_mtime
        assert landed < PAUSE_S, (number + 1, kind, f"{landed:.1f}s after the pause began")
        if number + 1 < len(FAULTS):
            arm(plan, FAULTS[number + 1][0], sink=SINK, pause_s=PAUSE_S)
    disarm(plan)
    assert job.wait() == 0, job.tail()
    assert mismatches(influx, files) == []
    stats = epochs(url, SINK)
    assert {e["state"] for e in stats} == {"COMMITTED"}
    assert [e["replays"] for e in stats] == [0] * len(stats)  # no batch ran twice
    log = job.stderr()
    assert "Spark master local[2] retries no failed task" in log, job.tail()
    # The driver's steps say they were repeated. A task's repeat is logged in its Python
    # worker, whose log Spark does not pass on; that no task failed (local[2] would have
    # failed the query) while each staging fault cut a paused task's open transaction
    # shows it.
    for step in ("decide", "mark"):
        assert f"{step} failed (attempt 1)" in log, (step, job.tail())
    assert SECRET not in log + job.out.read_text()  # the failures named the store
