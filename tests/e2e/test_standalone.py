"""The job on a standalone Spark cluster, as a cluster gets twophase: installed from the
wheel, not from the source tree; its driver SIGKILLed mid-promotion, then, each while a task
holds a staged write: the executor JVM running it, the executors' Python workers, and
the whole worker running it; exact afterwards.

The cluster is a master and two workers (one core each), separate JVMs on loopback,
from the pip-installed PySpark, with their work folders under ``.local/``. The wheel
goes into a virtualenv of its own (``pip install 'twophase[spark]'``), whose Python
runs the driver (``spark-submit``) and, through ``spark.pyspark.python``, every
executor's Python workers.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from devkit import SparkMasterServer, SparkWorkerServer
from devkit.ports import free_port
from tests.e2e.harness import (
    MALFORMED,
    SINK,
    SINKS,
    Job,
    Target,
    arm,
    epochs,
    feed,
    fired,
    mismatches,
    orphan_writes,
    run_job,
    start_job,
    wait_exact,
)
from tests.integration.cli_helpers import make_cli
from tests.support import REPO

pytestmark = pytest.mark.timeout(1200)

LOCAL = REPO / ".local"
# Two files per micro-batch: one batch per kill (five), one after.
FILES = 12


def run(*args: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=900, check=False, cwd=cwd
    )
    assert done.returncode == 0, f"{args}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv holding only the wheel (with its ``spark`` extra); its bin folder."""
    dist = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--wheel", "--outdir", dist, REPO)
    (wheel,) = dist.glob("*.whl")
    venv = tmp_path_factory.mktemp("wheel-venv")
    run(sys.executable, "-m", "venv", venv)
    run(venv / "bin" / "python", "-m", "pip", "install", "-q", f"{wheel}[spark]")
    code = "import twophase; print(twophase.__file__)"
    where = run(venv / "bin" / "python", "-c", code, cwd=dist)
    assert "site-packages" in where and str(REPO / "twophase") not in where
    return venv / "bin"


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[SparkMasterServer, list[SparkWorkerServer]]]:
    root = LOCAL / f"spark-standalone-{uuid.uuid4().hex[:8]}"
    master = SparkMasterServer(root / "master", free_port(), free_port())
    workers = [
        SparkWorkerServer(root / f"worker-{i}", free_port(), free_port(), master.master_url)
        for i in range(2)
    ]
    try:
        master.start()
        for worker in workers:
            worker.start()
        deadline = time.monotonic() + 60
        while master.alive_workers() < 2:
            assert time.monotonic() < deadline, "the workers did not register"
            time.sleep(0.5)
        yield master, workers
    finally:
        for daemon in (*workers, master):
            daemon.kill()
        shutil.rmtree(root, ignore_errors=True)  # executors' work folders: app jars, logs


EXECUTOR = "CoarseGrainedExecutorBackend"  # an executor JVM's main class
PYTHON_WORKER = "pyspark.daemon"  # the executor's Python daemon and the workers it forks
PAUSE_S = 120  # a paused task outlives any kill's delivery by far


def processes(worker: SparkWorkerServer, marker: str) -> list[int]:
    """Pids of processes this worker launched (they run in its work folder) whose
    command line holds ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if marker in cmdline and cwd.startswith(str(worker.root)):
            found.append(int(entry))
    return found


def test_the_job_from_the_wheel_on_a_standalone_cluster_survives_driver_and_executor_kills(
    target: Target,
    work: Path,
    event_files: list[Path],
    wheel_venv: Path,
    cluster: tuple[SparkMasterServer, list[SparkWorkerServer]],
) -> None:
    master, workers = cluster
    files = event_files[:FILES]
    python = wheel_venv / "python"
    url = make_url(target.staging_url)
    without_password = url.set(password=None).render_as_string(hide_password=False)
    launcher = [
        str(wheel_venv / "spark-submit"),
        *("--master", master.master_url),
        *("--conf", f"spark.pyspark.python={python}"),
        *("--conf", f"spark.pyspark.driver.python={python}"),
        *("--conf", "spark.executor.memory=768m", "--conf", "spark.task.maxFailures=4"),
        # executors stage: they get the staging store, the password apart (README)
        *("--conf", f"spark.executorEnv.TWOPHASE_STAGING_URL={without_password}"),
        *("--conf", f"spark.executorEnv.PGPASSWORD={url.password or ''}"),
    ]
    plan = work / "crash-plan.json"
    launcher += ["--conf", f"spark.executorEnv.TWOPHASE_CRASH_PLAN={plan}"]
    args = (target, work / "input", work / "checkpoint", SINK, work / "logs")
    options: dict[str, Any] = dict(
        launcher=launcher, cwd=work, available_now=False, max_files=2, crash_plan=plan
    )
    options["PYSPARK_PYTHON"] = str(python)
    # Staged by the executors' tasks, which the kills below are about (a small batch is
    # staged from the driver by default: test_exactly_once.py kills that path).
    options["TWOPHASE_DRIVER_STAGING_BYTES"] = "0"
    fed: list[Path] = []

    def feed_more(count: int) -> None:
        new = files[len(fed) : len(fed) + count]
        fed.extend(new)
        feed(work / "input", new)

    # a driver kill mid-promotion, then a restart (the driver's other steps are killed
    # on local masters: test_exactly_once.py, test_fanout.py, test_dead_letters.py)
    job = start_job(*args, **options)
    feed_more(2)
    arm(plan, "promote_batch", sink=SINK)
    job.wait_for("the armed crash", ended(job), 240)
    assert job.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL), job.tail()

    job = start_job(*args, **options)
    wait_exact(job, target, fed, MALFORMED, timeout=300)  # recovered, and replayed
    staging = Staging(job, plan, feed_more)
    staging.kill(lambda paused: [executor_of(paused)])
    wait_exact(job, target, fed, MALFORMED, timeout=300)
    assert "ExecutorLostFailure" in job.stderr(), job.tail()
    staging.kill(lambda paused: [paused, *python_workers(workers)])  # all of them
    wait_exact(job, target, fed, MALFORMED, timeout=300)
    staging.kill(lambda paused: [w.pid() for w in workers if paused in processes(w, "")])
    feed_more(len(files) - len(fed))
    wait_exact(job, target, fed, MALFORMED, timeout=300)
    assert staging.killed == 3, staging.killed
    job.kill()

    final = run_job(
        *args,
        available_now=True,
        max_files=2,
        launcher=launcher,
        cwd=work,
        PYSPARK_PYTHON=str(python),
        TWOPHASE_DRIVER_STAGING_BYTES="0",
    )
    assert final.returncode == 0, final.tail()
    assert not mismatches(target.influx, files)
    cli = make_cli(target.staging_url, target.influx)
    gc = cli.run("gc", "--yes")
    assert gc.code == 0, gc.err
    for sink in SINKS:
        assert {e["state"] for e in epochs(target.staging_url, sink)} == {"COMMITTED"}
    status = {s["sink_id"]: s for s in cli.run("status", "--json").json()["sinks"]}
    assert all(status[sink]["precommitted_epochs"] == 0 for sink in SINKS), status
    assert orphan_writes(target.staging_url) == 0


def ended(job: Job) -> Any:
    return lambda: job.returncode is not None


class Staging:
    """Pauses a task of the running job just after its write is staged (``after_stage``:
    the write committed, the task not ended) and kills processes there. The paused task
    fails with them; Spark retries it elsewhere, and the write of the killed attempt is
    an orphan."""

    def __init__(self, job: Job, plan: Path, feed_more: Callable[[int], None]) -> None:
        self.job, self.plan, self.feed_more = job, plan, feed_more
        self.killed = 0

    def kill(self, victims: Callable[[int], Sequence[int | None]]) -> None:
        """SIGKILL ``victims(pid of the paused task's Python worker)``."""
        arm(self.plan, "after_stage", scope="process", sink=SINK, pause_s=PAUSE_S)
        self.feed_more(2)
        marker = fired(self.plan)
        self.job.wait_for(
            "a task paused with its write staged",
            lambda: marker.exists() and marker.read_text().isdigit(),
            180,
        )
        pids = victims(int(marker.read_text()))
        assert pids, "nothing to kill"
        for pid in pids:
            assert pid, "a victim that is not running"
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.killed += 1


def python_workers(workers: list[SparkWorkerServer]) -> list[int]:
    return [pid for worker in workers for pid in processes(worker, PYTHON_WORKER)]


def executor_of(pid: int) -> int:
    """The executor JVM that ``pid`` (a Python worker) descends from."""
    while pid > 1:
        if EXECUTOR in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
            return pid
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    raise AssertionError("the paused task runs in no executor")
