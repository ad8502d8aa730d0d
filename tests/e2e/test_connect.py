"""The job as a Spark Connect client: both writers, the server SIGKILLed mid-protocol
and while tasks stage, the client restarted from the same checkpoint, exact afterwards;
and a restart from a deleted checkpoint refused (I6) without the user passing a query id.

Under Connect the server is the driver: it runs the protocol (the data source's
``commit``, the foreachBatch function in its own Python process) and its executors
stage, so the server, not the client, gets the ``TWOPHASE_*`` settings and the crash
plan. Killing its session is a power cut of the driver: the JVM, its Python workers and
the foreachBatch worker at once. The client keeps retrying its dead server (for
minutes, by PySpark's retry policy); the test kills it and restarts both, as an operator
or a scheduler would.
"""

from __future__ import annotations

import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from devkit import SparkConnectServer
from devkit.ports import free_port
from tests.e2e.harness import (
    MALFORMED,
    SINK,
    SINKS,
    Target,
    arm,
    epochs,
    feed,
    fired,
    kill_session,
    mismatches,
    orphan_writes,
    run_job,
    start_job,
    undecided_writes,
    wait_exact,
)
from tests.integration.cli_helpers import make_cli
from tests.support import REPO, admin_conninfo

pytestmark = pytest.mark.timeout(900)

LOCAL = REPO / ".local"
# Two files per micro-batch: one batch before the kills, one per kill, one after.
FILES = 8


@pytest.fixture
def server(target: Target, work: Path) -> Iterator[SparkConnectServer]:
    """A Connect server for this test's staging store and InfluxDB database."""
    root = LOCAL / f"spark-connect-{uuid.uuid4().hex[:8]}"
    settings = target.env(TWOPHASE_CRASH_PLAN=str(work / "crash-plan.json"))
    env = {k: v for k, v in settings.items() if k.startswith("TWOPHASE_")}
    connect = SparkConnectServer(root, free_port(), free_port(), env=env)
    try:
        connect.start(timeout=180)
        yield connect
    finally:
        crash(connect)
        shutil.rmtree(root, ignore_errors=True)


def crash(connect: SparkConnectServer) -> None:
    """SIGKILL the server's whole session: the JVM and every Python process it started."""
    pid = connect.pid()
    if pid is not None:
        kill_session(pid)


# The default run keeps the data source (its commit in a Python worker of the server's),
# killed at promote_batch; --full adds the foreachBatch writer killed at after_decide.
@pytest.mark.parametrize(
    ("writer", "point"),
    [
        pytest.param("foreach-batch", "after_decide", marks=pytest.mark.full),
        ("data-source", "promote_batch"),
    ],
)
def test_connect_client_survives_server_kills_and_refuses_a_reset_checkpoint(
    target: Target,
    work: Path,
    event_files: list[Path],
    server: SparkConnectServer,
    writer: str,
    point: str,
) -> None:
    files = event_files[:FILES]
    args = (target, work / "input", work / "checkpoint", SINK, work / "logs")
    options: dict[str, Any] = dict(
        launcher=[sys.executable],
        stats_writer=writer,
        available_now=False,
        max_files=2,
        extra_args=["--remote", server.remote_url],
    )
    fed: list[Path] = []

    def feed_more(count: int) -> None:
        new = files[len(fed) : len(fed) + count]
        fed.extend(new)
        feed(work / "input", new)

    # 1. the server dies at a protocol step (a crash point in its Python, session scope)
    job = start_job(*args, **options)
    feed_more(2)
    wait_exact(job, target, fed, MALFORMED)  # the client's claim let the batches commit
    arm(work / "crash-plan.json", point, sink=SINK)
    feed_more(2)
    job.wait_for("the server's crash", lambda: not server.is_running(), 240)
    assert fired(work / "crash-plan.json").exists()
    # The client retries its dead server for minutes (PySpark's retry policy): the
    # operator, or the scheduler that runs it, restarts it.
    job.kill()
    server.start(timeout=180)  # the operator restarts the server, then the client
    restarted = start_job(*args, **options)

    # 2. the server dies while a task has staged a write that is not decided yet
    with psycopg.connect(admin_conninfo(target.staging_url), autocommit=True) as conn:
        before = undecided_writes(conn)
        feed_more(2)
        restarted.wait_for(
            "a staged, undecided write", lambda: undecided_writes(conn) > before, 240, 0.005
        )
    crash(server)
    restarted.kill()
    server.start(timeout=180)
    last = start_job(*args, **options)
    feed_more(len(files) - len(fed))
    wait_exact(last, target, fed, MALFORMED, timeout=300)
    last.kill()

    final = run_job(*args, **{**options, "available_now": True})
    assert final.returncode == 0, final.tail()
    assert not mismatches(target.influx, files)
    cli = make_cli(target.staging_url, target.influx)
    assert cli.run("gc", "--yes").code == 0
    for sink in SINKS:
        assert {e["state"] for e in epochs(target.staging_url, sink)} == {"COMMITTED"}
    assert orphan_writes(target.staging_url) == 0
    # Under Connect the foreachBatch writer's run is its own: the run that ended is it.
    status = {s["sink_id"]: s for s in cli.run("status", "--json").json()["sinks"]}
    assert all(status[s]["owner_state"] == "ended" for s in SINKS), status

    # 3. a restart from a deleted checkpoint is refused; nothing is written
    shutil.rmtree(work / "checkpoint")
    refused = run_job(*args, **{**options, "available_now": True})
    assert refused.returncode == 2, refused.tail()
    assert "CheckpointResetError" in refused.stderr(), refused.tail()
    assert "twophase reset" in refused.stderr(), refused.tail()
    assert not mismatches(target.influx, files)
    for sink in SINKS:
        assert {e["state"] for e in epochs(target.staging_url, sink)} == {"COMMITTED"}
