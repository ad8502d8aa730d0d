"""A Spark job run as users run it, one process from launch to exit, and its timing.

:func:`run_job` launches a job as users launch one, ``spark-submit --master local[2,4]
<job>.py ...``, samples the CPU of its process tree and of the run's PostgreSQL
backends (:class:`bench.harness.cpu.Sampler`) and times it from launch to exit.
:func:`timing` reads the query's checkpoint afterwards: Spark writes ``offsets/N``
when it plans micro-batch N and ``commits/N`` when the batch is done (after the
sink's commit), so their modification times give, with the launch and exit times:

* ``startup_s``: launch to ``offsets/0`` (Python, the JVM, the session, the query);
* ``first_batch_s``: ``commits/0`` minus ``offsets/0`` (first batch: cold code paths,
  connections, tables made);
* ``steady_batch_s``: the median of ``commits/N`` minus ``offsets/N`` for N >= 1;
* ``tail_s``: the last ``commits/N`` to exit (the query's end, Spark stopping);
* ``wall_s``: launch to exit.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench.harness.cpu import Sampler
from bench.harness.servers import REPO
from bench.harness.sides import BenchError

MASTER = "local[2,4]"  # local[2] runs each task once: one failed task fails the query
TIMEOUT_S = 900


def missing() -> str | None:
    """Why Spark jobs cannot run here, or None."""
    for module in ("twophase.spark", "pyspark", "pyarrow"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is missing"
    if shutil.which("java") is None:
        return "no java on PATH (scripts/dev.sh setup installs it)"
    return None


def spark_submit() -> str:
    """The ``spark-submit`` of the PySpark this interpreter imports."""
    return str(Path(sys.executable).parent / "spark-submit")


def job_env(settings: dict[str, str]) -> dict[str, str]:
    """This environment without any ``TWOPHASE_*`` variable, plus ``settings``: each
    side gets only what it is given."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("TWOPHASE_")}
    return {
        **inherited,
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": str(REPO),
        "TZ": "UTC",
        **settings,
    }


def _batches(folder: Path) -> dict[int, float]:
    if not folder.is_dir():
        return {}
    return {int(p.name): p.stat().st_mtime for p in folder.iterdir() if p.name.isdigit()}


def timing(checkpoint: Path, launched: float, exited: float) -> dict[str, float]:
    """The run's phases from the query's checkpoint folder (``offsets``, ``commits``)
    and the wall-clock times (``time.time()``) of launch and exit."""
    offsets, commits = _batches(checkpoint / "offsets"), _batches(checkpoint / "commits")
    done = sorted(n for n in commits if n in offsets)
    if not done or done[0] != 0:
        raise BenchError(f"{checkpoint}: no committed batch 0 (offsets {sorted(offsets)})")
    steady = [commits[n] - offsets[n] for n in done if n >= 1]
    return {
        "wall_s": round(exited - launched, 3),
        "startup_s": round(offsets[0] - launched, 3),
        "first_batch_s": round(commits[0] - offsets[0], 3),
        "steady_batch_s": round(statistics.median(steady), 3) if steady else 0.0,
        "tail_s": round(exited - commits[done[-1]], 3),
        "batches": float(len(done)),
    }


def run_job(
    cmd: Sequence[str], env: dict[str, str], log: Path, checkpoint: Path, conninfo: str, prefix: str
) -> dict[str, float]:
    """Run ``cmd`` (its output to ``log``), timed from launch to exit: the timing of
    ``checkpoint`` and the CPU seconds of its processes and of the databases named
    ``prefix...``. Raises BenchError when it fails."""
    with open(log, "w") as out:
        launched = time.time()
        proc = subprocess.Popen(list(cmd), cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        sampler = Sampler(conninfo, prefix, proc.pid)
        try:
            code = proc.wait(TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = -1
        exited = time.time()
        cpu = sampler.stop()
    if code != 0:
        raise BenchError(f"{cmd} exited {code}:\n{log.read_text()[-3000:]}")
    figures = timing(checkpoint, launched, exited)
    figures |= {f"cpu_{group}_s": seconds for group, seconds in cpu.items()}
    figures["cpu_job_s"] = round(cpu["driver"] + cpu["jvm"] + cpu["python_workers"], 3)
    return figures
