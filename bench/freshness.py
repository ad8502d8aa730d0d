"""Freshness: how long after a file lands its aggregate is readable in InfluxDB.

A steady stream, as a dashboard's pipeline sees one: a feeder process drops
one events file per second into the source folder (written under a hidden
name, then renamed into place: the rename is the landing), and
``bench/freshness_job.py`` reads it with a 1-second processing-time
trigger, aggregates per 1-second window, stream and ISP, and writes the
windows to InfluxDB. Three sides run the same job on the same events:

- ``inline``: ``twophase.spark.foreach_batch_writer`` with ``promotion="inline"``;
- ``background``: the same with ``promotion="background"``;
- ``plain``: the at-least-once ``foreachBatch`` users write without twophase
  (``bench.spark_plain``'s: ``foreachPartition`` POSTs f-string line protocol).

Each file's events fall in a second of their own (file ``i``: second
``first + i``), so its aggregate is the 1-second window no other file
touches: readable once the window's ``events`` summed over its series
equal the file's events. The bench polls InfluxDB's ``/query`` for the
windows still awaited every ``POLL_S`` (over loopback: a dashboard's read,
not the job's link), and takes a file's freshness as the time from its
rename to the start of the first poll that saw its whole aggregate (so
within one poll period of the truth, on every side alike). Before the
stream, one small file is landed and its batch awaited, so that Spark's
start-up delays no stream file; the first ``warmup_files`` of the stream
(the first plans, warming workers) are discarded.

Per link (loopback; and the slow link, every InfluxDB answer held 20 ms and
100 Mbit/s each way, through the test kit's proxy in a process of its own),
the sides run one after the other, their order rotating per repeat, each
with its own InfluxDB database and staging database, dropped after the run.
Per side: p50 and p99 over every measured file of every repeat (and each
repeat's, for the spread). Target, per link: the better twophase mode's p99
(lower, named in the results) at most ``P99_SLACK_MS`` over plain's; the
other mode is reported.

``python -m bench freshness [--link loopback|slow ...] [--quick | --size ...]``
runs the metric alone and prints its results.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import urllib3

from bench.context import Context, run_alone
from bench.freshness_job import MEASUREMENT
from bench.plan import FULL, QUICK
from bench.report import best_of
from bench.servers import REPO
from bench.sides import BenchError
from bench.spark_runs import (
    LINKS,
    LOOPBACK,
    MASTER,
    SLOW_LINK,
    Link,
    compression,
    job_env,
    missing,
    reached,
)
from bench.stats import Summary, entry, skipped
from twophase.config import TargetConfig

SIDES = {
    "inline": ["--sink", "twophase", "--promotion", "inline"],
    "background": ["--sink", "twophase", "--promotion", "background"],
    "plain": ["--sink", "plain"],
}
MODES = ("inline", "background")  # twophase's sides; the better one carries the target
DEFAULT_LINKS = (LOOPBACK, SLOW_LINK)
P99_SLACK_MS = 150.0  # the better mode's p99 at most this much over plain's
PERIOD_S = 1.0  # one file per second, one trigger per second
SPAN_S = 0.99  # a file's events within its second, so that none rounds into the next
POLL_S = 0.020
START_TIMEOUT_S = 180.0  # Spark's start on a loaded machine
VISIBLE_TIMEOUT_S = 60.0  # a file not readable this long after landing fails the run
STOP_TIMEOUT_S = 120.0
PRIMER_INDEX = 99_999  # the file landed before the stream (its name: events-99999.jsonl)


@dataclass(frozen=True)
class Size:
    """Events per file (= per trigger), files discarded as warm-up and files measured
    per run, runs per side and link."""

    events_per_file: int
    warmup_files: int
    measured_files: int
    repeats: int

    @property
    def files(self) -> int:
        return self.warmup_files + self.measured_files


# by plan name. Full: 50 s of stream per run, 80-90 s with Spark's start and stop;
# 3 sides x 2 links x 2 repeats, about 15 minutes
SIZES = {
    "quick": Size(events_per_file=2_000, warmup_files=5, measured_files=15, repeats=1),
    "full": Size(events_per_file=3_000, warmup_files=10, measured_files=40, repeats=2),
}


@dataclass
class Sample:
    """One run: each measured file's freshness, and the job's data batches after warm-up."""

    latencies_ms: list[float]
    batch_ms: list[float] = field(default_factory=list)


def measure_freshness(
    ctx: Context, links: Sequence[Link] = DEFAULT_LINKS, size: Size | None = None
) -> dict[str, Any]:
    """p50 and p99 freshness of the three sides, per link."""
    reason = missing()
    if reason is not None:
        return skipped(f"not available yet: {reason}")
    size = size or SIZES.get(ctx.plan.name, SIZES["full"])
    samples: dict[str, dict[str, list[Sample]]] = {
        link.key: {side: [] for side in SIDES} for link in links
    }
    ctx.log(
        f"freshness: {size.events_per_file:,} events/s, {size.files} files/run "
        f"({size.warmup_files} warm-up), {size.repeats} repeats"
    )
    with tempfile.TemporaryDirectory(prefix="twophase-bench-fresh-") as tmp:
        for repeat in range(size.repeats):
            for link in links:
                for side in _rotated(list(SIDES), repeat):
                    ctx.log(f"freshness ({link.key} link): {side}, {repeat + 1}/{size.repeats}")
                    sample = _run(ctx, side, link, size, Path(tmp))
                    samples[link.key][side].append(sample)
                    _warn_backlog(ctx, side, sample)
    return _result(samples, links, size)


def _warn_backlog(ctx: Context, side: str, sample: Sample) -> None:
    median = statistics.median(sample.batch_ms) if sample.batch_ms else 0.0
    if median >= PERIOD_S * 1000:
        ctx.log(f"freshness: {side}'s batches ({median:.0f} ms) are slower than the trigger")


def _rotated(names: list[str], repeat: int) -> list[str]:
    shift = repeat % len(names)
    return names[shift:] + names[:shift]


# --- one run ---------------------------------------------------------------------------


def _run(ctx: Context, side: str, link: Link, size: Size, work: Path) -> Sample:
    """One run of ``side`` over ``link`` into databases of its own, dropped after."""
    name = f"fresh_{side}_{uuid.uuid4().hex[:8]}"
    influx = ctx.scratch.influx(name)
    folder = work / name / "input"
    folder.mkdir(parents=True)
    try:
        staging = None if side == "plain" else ctx.scratch.staging_url(name)
        with reached(link, influx.url) as url:
            env = job_env(staging, dataclasses.replace(influx, url=url))
            job = Job(_command(side, folder, work / name), env, work / f"{name}.stderr")
            try:
                job.wait_started()
                landed, visible = _stream(job, folder, influx, size)
                job.stop()
            finally:
                job.kill()
        return _sample(landed, visible, job.progress, size)
    finally:
        ctx.scratch.drop(name)


def _command(side: str, folder: Path, work: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "bench.freshness_job",
        "--input",
        str(folder),
        "--checkpoint",
        str(work / "checkpoint"),
        "--sink-id",
        f"bench-{work.name}",
        "--master",
        MASTER,
        "--conf",
        "spark.ui.enabled=false",
        *SIDES[side],
    ]


def _stream(
    job: Job, folder: Path, influx: TargetConfig, size: Size
) -> tuple[dict[int, float], dict[int, float]]:
    """Feed ``size.files`` files, one a second, and poll until each one's aggregate is
    readable; the landing and the first-seen times per file index."""
    _prime(job, folder)
    first = int(time.time()) + 2  # file i's events: second first + i, never the past's
    feeder = Feeder(folder, first, size)
    poller = Poller(influx)
    landed: dict[int, float] = {}
    visible: dict[int, float] = {}
    try:
        while len(visible) < size.files:
            landed.update(feeder.landed())
            _check(job, landed, visible)
            asked = time.time()
            waiting = [i for i in landed if i not in visible]
            if waiting:
                seen = poller.windows(first + min(waiting) + 1, first + max(waiting) + 1)
                for index in waiting:
                    if seen.get(first + index + 1) == size.events_per_file:
                        visible[index] = asked
            time.sleep(max(0.0, asked + POLL_S - time.time()))
    finally:
        feeder.close()
        poller.close()
    return landed, visible


def _prime(job: Job, folder: Path) -> None:
    """Land one small file and wait for its batch before the stream starts: Spark's
    start-up (the JVM, the first plans and Python workers) then delays no stream file
    (a backlog that warm-up files alone would take long to work off on a slow machine)."""
    from jobs.generate_events import file_lines, write_atomically

    # a second of its own, long before the stream's, and a name no stream file has
    lines = list(file_lines(random.Random(0), int(time.time()) - 30, SPAN_S, 100, 0.0, 0))
    write_atomically(folder, PRIMER_INDEX, lines, mtime=time.time())
    deadline = time.monotonic() + START_TIMEOUT_S
    while not any(p["input_rows"] for p in job.progress):
        if job.exited() or time.monotonic() > deadline:
            raise BenchError(f"the Spark job read no first file:\n{job.stderr_tail()}")
        time.sleep(0.1)


def _check(job: Job, landed: dict[int, float], visible: dict[int, float]) -> None:
    """Fail the run when the job died or a file stays unreadable too long."""
    if job.exited():
        raise BenchError(f"the Spark job ended early:\n{job.stderr_tail()}")
    now = time.time()
    late = [i for i, at in landed.items() if i not in visible and now - at > VISIBLE_TIMEOUT_S]
    if late:
        raise BenchError(f"file {min(late)} not readable {VISIBLE_TIMEOUT_S:.0f} s after landing")


def _sample(
    landed: dict[int, float], visible: dict[int, float], progress: list[dict[str, Any]], size: Size
) -> Sample:
    measured = range(size.warmup_files, size.files)
    latencies = [(visible[i] - landed[i]) * 1000 for i in measured]
    # the stream's data batches (the primer's first; the no-data batches between them only
    # move the watermark), one per file in steady state: the last ones the measured files'
    batches = [p for p in progress if p["input_rows"]][1:][-size.measured_files :]
    return Sample(latencies, [float(p["duration_ms"]) for p in batches])


# --- the feeder, the poller, the job ---------------------------------------------------


def _feed(folder: str, first: int, size: Size, pipe: Connection) -> None:
    """The feeder process: file ``i`` lands ``i`` seconds after the start (its events in
    second ``first + i``); sends ``(i, landing time)`` after each rename."""
    from jobs.generate_events import file_lines, write_atomically

    rng = random.Random(first)
    start = time.time()
    for index in range(size.files):
        lines = list(file_lines(rng, first + index, SPAN_S, size.events_per_file, 0.0, 0))
        time.sleep(max(0.0, start + index * PERIOD_S - time.time()))
        write_atomically(Path(folder), index, lines, mtime=time.time())
        pipe.send((index, time.time()))


class Feeder:
    """The feeder in a process of its own (spawned: the bench runs threads), so that
    generating and writing files takes no interpreter lock from the poller."""

    def __init__(self, folder: Path, first: int, size: Size) -> None:
        context = multiprocessing.get_context("spawn")
        self._pipe, child = context.Pipe(duplex=False)
        self._process = context.Process(
            target=_feed, args=(str(folder), first, size, child), daemon=True
        )
        self._process.start()
        child.close()

    def landed(self) -> dict[int, float]:
        """The files landed since the last call: index -> landing time."""
        out: dict[int, float] = {}
        while self._pipe.poll():
            try:
                index, at = self._pipe.recv()
            except EOFError:  # the feeder has fed every file and is gone
                break
            out[index] = at
        return out

    def close(self) -> None:
        if self._process.is_alive():
            self._process.terminate()
        self._process.join(5)
        self._pipe.close()


class Poller:
    """Reads InfluxDB back over one kept-alive connection: the summed ``events`` per
    1-second window."""

    def __init__(self, influx: TargetConfig) -> None:
        self._pool = urllib3.connection_from_url(influx.url, maxsize=1, timeout=5.0)
        self._database = str(influx.influxdb.database)

    def windows(self, low: int, high: int) -> dict[int, int]:
        """Window (its end, epoch seconds) -> events summed over its series, for the
        windows from ``low`` to ``high`` that InfluxDB holds."""
        q = (
            f"SELECT sum(events) FROM {MEASUREMENT} "  # noqa: S608 (numbers and a constant)
            f"WHERE time >= {low}s AND time <= {high}s GROUP BY time(1s) fill(none)"
        )
        fields = {"db": self._database, "q": q, "epoch": "s"}
        response = self._pool.request("GET", "/query", fields=fields)
        if response.status != 200:
            raise BenchError(f"InfluxDB refused a query ({response.status}): {response.data!r}")
        out: dict[int, int] = {}
        for result in json.loads(response.data).get("results", []):
            for series in result.get("series", []):
                out.update((int(t), int(total)) for t, total in series["values"])
        return out

    def close(self) -> None:
        self._pool.close()


class Job:
    """``bench/freshness_job.py`` as a process: its progress followed on a thread;
    ``stop`` closes its standard input, which stops the query."""

    def __init__(self, cmd: list[str], env: dict[str, str], stderr: Path) -> None:
        self._stderr_path = stderr
        self._stderr = open(stderr, "w")  # noqa: SIM115 (closed by kill)
        self._proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self.progress: list[dict[str, Any]] = []
        self._started = threading.Event()
        self._reader = threading.Thread(target=self._follow, daemon=True)
        self._reader.start()

    def _follow(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            kind, _, data = line.partition(" ")
            if kind == "STARTED":
                self._started.set()
            elif kind == "PROGRESS":
                self.progress.append(json.loads(data))

    def wait_started(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._started.wait(0.2):
            if self.exited() or time.monotonic() > deadline:
                raise BenchError(f"the Spark job did not start:\n{self.stderr_tail()}")

    def exited(self) -> bool:
        return self._proc.poll() is not None

    def stop(self) -> None:
        """End the query (a last background promotion drained) and wait for the exit."""
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        try:
            code = self._proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise BenchError(f"the Spark job did not stop in {STOP_TIMEOUT_S:.0f} s") from None
        if code != 0:
            raise BenchError(f"the Spark job failed ({code}):\n{self.stderr_tail()}")
        self._reader.join(5)

    def kill(self) -> None:
        if not self.exited():
            self._proc.kill()
            self._proc.wait(10)
        self._stderr.close()

    def stderr_tail(self) -> str:
        self._stderr.flush()
        return self._stderr_path.read_text(errors="replace")[-3000:]


# --- results ---------------------------------------------------------------------------


def percentile(values: Sequence[float], q: int) -> float:
    """The ``q``-th percentile (linear between order statistics; a lone value is itself)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def _result(
    samples: dict[str, dict[str, list[Sample]]], links: Sequence[Link], size: Size
) -> dict[str, Any]:
    best = {link.key: _best(samples[link.key]) for link in links}
    parts = {
        f"{link.key} {mode} p{q}": _part(samples[link.key], mode, q, mode == best[link.key], link)
        for link in links
        for mode in MODES
        for q in (50, 99)
    }
    return {
        **best_of(parts, f"{links[-1].key} {best[links[-1].key]} p99", best),
        "batches": {
            link.key: {side: _batches(runs) for side, runs in samples[link.key].items()}
            for link in links
        },
        "input": {
            **dataclasses.asdict(size),
            "trigger_s": PERIOD_S,
            "poll_ms": POLL_S * 1000,
            "master": MASTER,
            "links": [link.as_dict() for link in links],
            "compression": compression(),
        },
    }


def _pooled(runs: list[Sample]) -> list[float]:
    return [ms for run in runs for ms in run.latencies_ms]


def _best(by_side: dict[str, list[Sample]]) -> str:
    """The twophase mode with the lower p99 over all its measured files."""
    return min(MODES, key=lambda mode: percentile(_pooled(by_side[mode]), 99))


def _part(
    by_side: dict[str, list[Sample]], mode: str, q: int, best: bool, link: Link
) -> dict[str, Any]:
    """``mode``'s ``q``-th percentile against plain's: the sides show each repeat's; the
    difference is of the percentiles over every measured file of every repeat."""
    pooled = {side: percentile(_pooled(by_side[side]), q) for side in (mode, "plain")}
    difference = pooled[mode] - pooled["plain"]
    target = q == 99 and best
    return entry(
        "ms",
        {
            side: Summary.of([percentile(run.latencies_ms, q) for run in by_side[side]])
            for side in (mode, "plain")
        },
        difference,
        f"{mode} - plain, ms: p{q} over every measured file of every repeat",
        f"<= +{P99_SLACK_MS:.0f} ms over plain (the better mode)" if target else "none (reported)",
        difference <= P99_SLACK_MS if target else None,
        pooled_ms={side: round(ms, 1) for side, ms in pooled.items()},
        files={side: len(_pooled(by_side[side])) for side in (mode, "plain")},
        best_mode=best,
        **link.as_dict(),
    )


def _batches(runs: list[Sample]) -> dict[str, Any]:
    """The median time of a side's measured data batches, and whether it kept up with
    the stream: a side slower than the trigger builds a backlog, and its freshness
    then grows with the run's length rather than saying what a batch costs."""
    times = [ms for run in runs for ms in run.batch_ms]
    median = statistics.median(times) if times else None
    return {
        "median_ms": None if median is None else round(median, 1),
        "kept_up": None if median is None else median < PERIOD_S * 1000,
    }


# --- alone -----------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench freshness", description=__doc__)
    ap.add_argument(
        "--link",
        action="append",
        choices=list(LINKS),
        help="the link(s) to InfluxDB, in order (default: loopback, then slow)",
    )
    ap.add_argument("--quick", action="store_true", help="the quick plan's size")
    ap.add_argument(
        "--size",
        type=int,
        nargs=4,
        default=None,
        metavar=("EVENTS_PER_FILE", "WARMUP_FILES", "MEASURED_FILES", "REPEATS"),
        help="instead of the plan's (a smoke run)",
    )
    return ap.parse_args(argv)


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    links = [LINKS[key] for key in args.link] if args.link else list(DEFAULT_LINKS)
    size = None if args.size is None else Size(*args.size)
    plan = QUICK if args.quick else FULL
    return run_alone(plan, lambda ctx: measure_freshness(ctx, links, size))
