"""One Spark job as a process, timed from its start: what metrics 6 and 9 share.

A job prints one ``PROGRESS`` line (JSON) per micro-batch of its query
(``jobs/session_metrics.py``, ``bench/spark_plain.py``,
``bench/spark_raw_job.py``). :func:`run_job` starts it, follows those lines
and gives the wall time (start to exit), the time to the first batch (start
to the first ``PROGRESS`` line), and the steady state: the median
``triggerExecution`` of the batches that read input after the warm-up ones,
and their input rows per second.

A :class:`Link` says how the jobs reach InfluxDB: over loopback, or through
the test kit's fault proxy in a process of its own, adding a round trip and
a bandwidth limit (:func:`reached`). PostgreSQL stays local on every link,
as a staging store beside the Spark driver would be.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.proxies import ProxyProcess
from bench.servers import REPO
from bench.sides import BenchError
from bench.stats import rotated
from twophase.config import ALIASES, TargetConfig, env_name

MASTER = "local[2,4]"  # local[2] would run each task once: one failed task fails the query
TIMEOUT_S = 600
QUERY = "stats"  # the query metric 6's jobs report progress under

Progress = list[dict[str, Any]]
_OTHER = frozenset({"CPU", "STAGES"})  # the record kinds a job may print besides progress


@dataclass(frozen=True)
class Link:
    """How a job reaches InfluxDB: ``key`` names it in results; a round trip added to
    every answer and a bandwidth each way (bits per second; None: loopback's)."""

    key: str
    round_trip_s: float = 0.0
    bandwidth_bps: float | None = None

    @property
    def proxied(self) -> bool:
        return self.round_trip_s > 0 or self.bandwidth_bps is not None

    def as_dict(self) -> dict[str, Any]:
        return {
            "link": self.key,
            "round_trip_ms": round(self.round_trip_s * 1000, 3),
            "bandwidth_mbit_s": None if self.bandwidth_bps is None else self.bandwidth_bps / 1e6,
        }


LOOPBACK = Link("loopback")
# InfluxDB in another region: a 20 ms round trip over a 100 Mbit/s link shared by
# every connection of the job, as a real link is
SLOW_LINK = Link("slow", 0.020, 100e6)
LINKS = {link.key: link for link in (LOOPBACK, SLOW_LINK)}


@contextmanager
def reached(link: Link, url: str) -> Iterator[str]:
    """The InfluxDB URL a job writes to over ``link``: ``url`` itself on loopback, else
    a proxy's, in a child process so that its relaying takes no interpreter lock
    from the bench (it still shares the machine's cores)."""
    if not link.proxied:
        yield url
        return
    with ProxyProcess(url, link.round_trip_s, bandwidth_bps=link.bandwidth_bps) as proxy:
        yield proxy.url


@dataclass(frozen=True)
class Run:
    """One job process: seconds to exit and to the first batch; steady batch time and rate."""

    wall_s: float
    first_batch_s: float
    steady_ms: float
    steady_rows_per_s: float  # input rows of the steady batches over their summed time
    # the job's other records by kind (a line ``KIND {json}`` other than PROGRESS,
    # STARTED and DONE; the last of each kind), e.g. ``CPU`` from ``bench/costs_job.py``
    records: dict[str, Any] = field(default_factory=dict, compare=False)


def compression() -> str:
    """The compression twophase's sides stage with: the environment's setting (the jobs
    inherit it), else the default."""
    from twophase.config import default

    return os.environ.get(env_name("compression")) or str(default("compression"))


def missing(job: Path | None = None) -> str | None:
    """Why the Spark metrics cannot run here, or None."""
    if job is not None and not job.exists():
        return f"{job.relative_to(REPO)} is missing"
    for module in ("twophase.spark", "pyspark", "pyarrow"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is missing"
    if shutil.which("java") is None:
        return "no java on PATH (scripts/dev.sh setup installs it)"
    return None


def job_env(staging_url: str | None, influx: TargetConfig) -> dict[str, str]:
    """The job's environment: the scratch staging database (None: none, for a job that
    does not stage) and InfluxDB database."""
    former = {env_name(alias) for alias in ALIASES}  # the current names are set below
    inherited = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TWOPHASE_CRASH") and k != "TWOPHASE_STAGING_URL" and k not in former
    }
    return {
        **inherited,
        **({} if staging_url is None else {"TWOPHASE_STAGING_URL": staging_url}),
        "TWOPHASE_TARGET_URL": influx.url,
        "TWOPHASE_INFLUX_API": "v1",
        "TWOPHASE_INFLUX_DB": str(influx.influxdb.database),
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": str(REPO),
    }


def job_command(
    entry: Sequence[str], input_dir: Path, checkpoint: Path, sink_id: str, per_trigger: int
) -> list[str]:
    """The command line every job takes: input, checkpoint, sink, trigger, ``local[2,4]``."""
    return [
        sys.executable,
        *entry,
        "--input",
        str(input_dir),
        "--checkpoint",
        str(checkpoint),
        "--sink-id",
        sink_id,
        "--max-files-per-trigger",
        str(per_trigger),
        "--master",
        MASTER,
        "--conf",
        "spark.ui.enabled=false",
        "--available-now",
    ]


def run_job(
    cmd: Sequence[str],
    env: dict[str, str],
    stderr: Path,
    label: str,
    steady_after: int,
    query: str = QUERY,
) -> Run:
    """Run ``cmd``, timed from process start, following the progress of its ``query``;
    its standard error goes to ``stderr``."""
    started = time.monotonic()
    with open(stderr, "w+") as err:
        proc = subprocess.Popen(
            list(cmd), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=err, text=True
        )
        batches, first, records = _follow(proc, started, query)
        code = proc.wait()
        wall = time.monotonic() - started
        err.seek(0)
        if code != 0 or first is None:
            raise BenchError(f"{label} Spark job failed ({code}):\n{err.read()[-3000:]}")
    steady = [b for b in batches if b["batch"] >= steady_after and b["input_rows"]]
    if not steady:
        raise BenchError(f"{label}: no batch with input after batch {steady_after}")
    rows = sum(b["input_rows"] for b in steady)
    seconds = sum(b["duration_ms"] for b in steady) / 1000
    median = statistics.median(b["duration_ms"] for b in steady)
    return Run(wall, first, median, rows / seconds, records)


def rotated_runs(
    sides: Iterable[str], repeats: int, run: Callable[[str, int], Run]
) -> dict[str, list[Run]]:
    """``run(side, repeat)`` for every side, ``repeats`` times, the sides' order rotating
    each repeat (:func:`bench.stats.rotated`); each side's runs."""
    runs: dict[str, list[Run]] = {side: [] for side in sides}

    def one(side: str) -> Callable[[int], float]:
        def timed(repeat: int) -> float:
            runs[side].append(run(side, repeat))
            return runs[side][-1].wall_s

        return timed

    rotated(repeats, {side: one(side) for side in runs})
    return runs


def _follow(
    proc: subprocess.Popen[str], started: float, query: str
) -> tuple[Progress, float | None, dict[str, Any]]:
    """The query's PROGRESS records, the seconds to the first one, and the other
    records by kind."""
    assert proc.stdout is not None
    batches: Progress = []
    records: dict[str, Any] = {}
    first = None
    deadline = started + TIMEOUT_S
    for line in proc.stdout:
        if time.monotonic() > deadline:
            proc.kill()
            raise BenchError(f"a Spark job ran over {TIMEOUT_S} s")
        kind, _, text = line.partition(" ")
        if kind in _OTHER and text.startswith("{"):
            records[kind] = json.loads(text)
        if kind != "PROGRESS":
            continue
        record = json.loads(text)
        if record.get("query") == query:
            first = first if first is not None else time.monotonic() - started
            batches.append(record)
    return batches, first, records
