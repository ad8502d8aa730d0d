"""The soak: four sinks in four streaming queries (four drivers) sharing one private
staging database and one private InfluxDB, fed over time, under a seeded schedule of
overlapping faults; then, per sink, the checks of exactly-once and a report.

Each sink runs ``jobs/session_metrics.py`` continuously with a supervisor that
restarts its driver whenever it exits (killed by a fault, or failed), as a
cluster manager would. The sinks differ so that more paths are soaked:

0. defaults (foreachBatch, inline promotion, 4 lanes)
1. one lane (``promote_connections=1``)
2. background promotion
3. the ``twophase`` data source (complete mode)
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from devkit import InfluxServer, PostgresServer
from devkit.faultproxy import FaultProxy
from devkit.ports import free_port
from jobs.generate_events import expected, generate
from tests.e2e.harness import (
    Job,
    Target,
    decided_dead_letters,
    feed,
    kill_session,
    mismatches,
    orphan_writes,
    query,
    start_job,
)
from tests.soak.faults import Injector
from tests.soak.schedule import DEADLINE_S, Fault, describe, make_schedule
from tests.support import alembic, create_influx_database
from twophase.config import InfluxDBSettings, TargetConfig

PG_PASSWORD = "Soak-Pg-Secret-8086"  # distinctive: grepped for in every output
INFLUX_PASSWORD = "Soak-Influx-Secret-5432"
DATABASE = "soak"
VARIANTS: tuple[tuple[str, dict[str, str]], ...] = (
    ("foreach-batch", {}),
    ("foreach-batch", {"TWOPHASE_PROMOTE_CONNECTIONS": "1"}),
    ("foreach-batch", {"TWOPHASE_PROMOTION": "background"}),
    ("data-source", {}),
)
GC_EVERY_S = 15.0
RETENTION_S = 30
# The jobs' retry deadlines: the schedule's short outages are ridden out inside the
# batch, its long ones fail the query (and a restart recovers it).
DEADLINES = {
    "TWOPHASE_TARGET_RETRY_DEADLINE": f"{DEADLINE_S:g}s",
    "TWOPHASE_STAGING_RETRY_DEADLINE": f"{DEADLINE_S:g}s",
    "TWOPHASE_TARGET_RETRY_MAX": "2s",  # back within 2 s of the server's return
}
# Staged chunks of epochs decided before the gc started minus retention: gc's job.
_STALE_CHUNKS = (
    "SELECT count(*) FROM twophase_staged_chunks c"
    " JOIN twophase_writes w ON w.write_id = c.write_id"
    " JOIN twophase_epochs e ON e.sink_id = w.sink_id AND e.epoch = w.epoch"
    " WHERE e.state IN ('COMMITTED', 'ABORTED') AND w.staged_at < %s"
    " AND COALESCE(e.committed_at, e.aborted_at) < %s - make_interval(secs => %s)"
)


@dataclass(frozen=True)
class Plan:
    """One soak: its size, its faults, where it works."""

    seed: int
    events_per_sink: int
    faults: int
    span_s: float
    work: Path
    files_per_sink: int = 20
    feed_every_s: float = 2.0
    finish_timeout_s: float = 900.0


@dataclass
class SinkRun:
    """One sink's query and what happened to it."""

    number: int
    sink_id: str
    files: list[Path]
    stats_writer: str
    env: dict[str, str]
    job: Job | None = None
    starts: int = 0
    harness_kills: int = 0
    failures: list[str] = field(default_factory=list)
    kills_at_start: int = 0
    fed: int = 0  # files fed so far
    finished: bool = False  # fed and exact: its supervisor stops it

    @property
    def folder(self) -> Path:
        return self.files[0].parent.parent


@dataclass
class Report:
    seed: int
    faults_planned: list[str]
    faults_done: dict[str, int]
    faults_skipped: dict[str, int]
    seconds: float
    gc_runs: int
    gc_failures: int
    max_staged_chunks: int
    max_staged_bytes: int
    stale_chunks_after_gc: int
    sinks: list[dict[str, Any]]

    @property
    def exact(self) -> bool:
        return all(sink["exact"] for sink in self.sinks)

    def table(self) -> str:
        head = "sink       events  epochs  replays  dead letters  recoveries (killed/failed)  exact"
        rows = [head]
        for s in self.sinks:
            rows.append(
                f"{s['sink']:<9} {s['events']:>7} {s['epochs']:>7} {s['replays']:>8} "
                f"{s['dead_letters']:>13}  {s['recoveries']:>10} ({s['killed']}/{s['failed']})"
                f"{'':>12}{'exact' if s['exact'] else 'NOT EXACT'}"
            )
        done = ", ".join(f"{k} {v}" for k, v in sorted(self.faults_done.items()))
        rows.append(
            f"faults: {sum(self.faults_done.values())} ({done}); seed {self.seed}; "
            f"{self.seconds:.0f} s; gc runs {self.gc_runs} ({self.gc_failures} met an "
            f"outage), staged at most {self.max_staged_chunks} chunks / "
            f"{self.max_staged_bytes} bytes, chunks past retention after a gc "
            f"{self.stale_chunks_after_gc}"
        )
        return "\n".join(rows)


class Soak:
    """Servers, sinks, supervisors, faults, checks. ``run()`` returns the report."""

    def __init__(self, plan: Plan, log: Callable[[str], None] = print) -> None:
        self.plan, self.log = plan, log
        self.outputs: list[str] = []  # CLI outputs, grepped for secrets
        self._stop = threading.Event()
        self._faulting = threading.Event()  # set when the schedule starts
        self._lock = threading.Lock()
        self.gc_runs = self.gc_failures = self.max_chunks = self.max_bytes = self.stale = 0
        self.runs: list[SinkRun] = []

    # -- setup ------------------------------------------------------------------------------
    def _servers(self) -> None:
        work = self.plan.work
        self.postgres = PostgresServer(work / "pg", free_port())
        self.influx = InfluxServer(work / "influx", free_port())
        self.postgres.start()
        self.influx.start()
        self.proxy = FaultProxy("127.0.0.1", self.influx.port).start()
        self.postgres.create_database(DATABASE)
        self.postgres.set_password(PG_PASSWORD)
        self.url = self.postgres.url_for(DATABASE)
        assert alembic("upgrade", "head", url=self.url).returncode == 0

    def _sinks(self) -> list[SinkRun]:
        plan, runs = self.plan, []
        per_file = max(1, plan.events_per_sink // plan.files_per_sink)
        for number, (writer, env) in enumerate(VARIANTS):
            folder = plan.work / f"sink{number}"
            files = generate(folder / "events", plan.files_per_sink, per_file, plan.seed + number)
            create_influx_database(self.influx.url, f"soak{number}")
            env = (
                env
                | DEADLINES
                | {
                    "TWOPHASE_TARGET_USERNAME": "soak",
                    "TWOPHASE_TARGET_PASSWORD": INFLUX_PASSWORD,
                }
            )
            runs.append(SinkRun(number, f"soak{number}", files, writer, env))
        return runs

    def target(self, run: SinkRun, direct: bool = False) -> Target:
        url = self.influx.url if direct else self.proxy.url
        return Target(
            self.url,
            TargetConfig(
                url=url, influxdb=InfluxDBSettings(api="v1", database=f"soak{run.number}")
            ),
        )

    # -- running ----------------------------------------------------------------------------
    def _supervise(self, run: SinkRun) -> None:
        """Keep the sink's driver running until the soak stops it or the sink is done."""
        while not self._stop.is_set() and not run.finished:
            job = run.job
            if job is None or job.returncode is not None:
                if job is not None:
                    self._record_exit(run, job)
                with self._lock:
                    run.kills_at_start = run.harness_kills
                    run.starts += 1
                    run.job = start_job(
                        self.target(run),
                        run.folder / "input",
                        run.folder / "checkpoint",
                        run.sink_id,
                        run.folder / "logs",
                        available_now=False,
                        max_files=2,
                        stats_writer=run.stats_writer,
                        **run.env,  # type: ignore[arg-type]
                    )
            self._stop.wait(0.5)
        if run.job is not None and run.job.returncode is None:
            run.job.kill()

    def _record_exit(self, run: SinkRun, job: Job) -> None:
        kill_session(job.proc.pid)  # what a killed driver left behind
        if run.harness_kills > run.kills_at_start:
            return
        errors = [line for line in job.stderr().splitlines() if "rror" in line]
        run.failures.append(f"exit {job.returncode}: {errors[-1] if errors else '?'}"[:300])
        self.log(f"sink {run.number} failed and is restarted: {run.failures[-1]}")

    def _kill(self, number: int) -> None:
        with self._lock:
            self.runs[number].harness_kills += 1

    def _feed(self, run: SinkRun) -> None:
        """One file at once (the query's first epoch), the rest over time once the faults
        begin, so that they land while the sinks are busy."""
        for index, source in enumerate(run.files):
            if index == 1:
                while not self._faulting.wait(1.0):
                    if self._stop.is_set():
                        return
            if self._stop.is_set():
                return
            feed(run.folder / "input", [source])
            run.fed += 1
            self._stop.wait(self.plan.feed_every_s if index else 0.0)

    def _gc_loop(self) -> None:
        while not self._stop.wait(GC_EVERY_S):
            self._gc_once()

    def _gc_once(self) -> None:
        """``twophase gc`` with the soak's retention, then: is anything it should have
        removed left? (A gc that meets an outage fails; the next one does its work.)"""
        try:
            since = query(self.url, "SELECT now()")[0][0]
        except psycopg.Error:
            return
        done = self._cli("gc", "--yes", TWOPHASE_RETENTION=f"{RETENTION_S}s")
        self.gc_runs += 1
        self.gc_failures += done.returncode != 0
        if done.returncode != 0:
            return
        try:
            stale = int(query(self.url, _STALE_CHUNKS, since, since, RETENTION_S)[0][0])
            chunks = int(query(self.url, "SELECT count(*) FROM twophase_staged_chunks")[0][0])
            size = query(self.url, "SELECT COALESCE(sum(staged_bytes), 0) FROM twophase_sinks")
        except psycopg.Error:
            return
        if stale:
            self.log(f"gc left {stale} staged chunks of epochs past retention")
        self.stale = max(self.stale, stale)
        self.max_chunks = max(self.max_chunks, chunks)
        self.max_bytes = max(self.max_bytes, int(size[0][0]))

    def _cli(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        base = self.target(self.runs[0], direct=True).env(**env)
        command = [str(Path(sys.executable).with_name("twophase")), *args]
        done = subprocess.run(command, env=base, capture_output=True, text=True, timeout=300)
        self.outputs += [done.stdout, done.stderr]
        return done

    def _threads(self, target: Callable[..., None], *args: Any) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        return thread

    def run(self) -> Report:
        started = time.monotonic()
        self._servers()
        self.runs = self._sinks()
        schedule = make_schedule(self.plan.seed, self.plan.faults, self.plan.span_s, len(self.runs))
        self.log(describe(self.plan.seed, schedule))
        try:
            return self._run(schedule, started)
        finally:
            self._stop.set()
            for run in self.runs:
                if run.job is not None:
                    kill_session(run.job.proc.pid)
            self.proxy.stop()
            self.influx.stop()
            self.postgres.destroy()

    def _run(self, schedule: list[Fault], started: float) -> Report:
        threads = [self._threads(self._supervise, run) for run in self.runs]
        threads += [self._threads(self._feed, run) for run in self.runs]
        threads.append(self._threads(self._gc_loop))
        self._wait_first_epochs()
        injector = Injector(
            self.postgres,
            DATABASE,
            self.influx,
            self.proxy,
            lambda n: self.runs[n].job,
            self._kill,
            self.log,
        )
        self._faulting.set()
        injector.run(schedule, time.monotonic())
        injector.wait()
        self.log("schedule done; waiting for every sink to be exact")
        self._wait_exact()
        self._stop.set()
        for thread in threads:
            thread.join(120)
        sinks = self._check()
        return Report(
            seed=self.plan.seed,
            faults_planned=[f.describe() for f in schedule],
            faults_done=dict(injector.done),
            faults_skipped=dict(injector.skipped),
            seconds=time.monotonic() - started,
            gc_runs=self.gc_runs,
            gc_failures=self.gc_failures,
            max_staged_chunks=self.max_chunks,
            max_staged_bytes=self.max_bytes,
            stale_chunks_after_gc=self.stale,
            sinks=sinks,
        )

    def _wait_first_epochs(self) -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            rows = query(self.url, "SELECT count(DISTINCT sink_id) FROM twophase_epochs")
            if int(rows[0][0]) >= len(self.runs):
                return
            time.sleep(1)
        raise AssertionError("the sinks did not all commit a first epoch within 600 s")

    def _problems(self, run: SinkRun) -> list[str]:
        problems = mismatches(self.target(run, direct=True).influx, run.files)
        dead = decided_dead_letters(self.url, f"{run.sink_id}.malformed")
        want = expected(run.files).malformed
        return problems + ([f"{dead} dead letters, expected {want}"] if dead != want else [])

    def _wait_exact(self) -> None:
        """Until every sink has been fed all its files and is exact; each one's driver is
        stopped as soon as it is (the supervisor sees ``finished``)."""
        deadline = time.monotonic() + self.plan.finish_timeout_s
        pending = list(self.runs)
        while pending and time.monotonic() < deadline:
            for run in pending:
                if run.fed == len(run.files) and not self._problems(run):
                    run.finished = True
                    self.log(f"sink {run.number} is exact; its driver is stopped")
            pending = [run for run in pending if not run.finished]
            time.sleep(2)
        for run in pending:
            self.log(f"sink {run.number} not exact in time: {self._problems(run)[:5]}")

    # -- checks -----------------------------------------------------------------------------
    def _check(self) -> list[dict[str, Any]]:
        sinks = [run.sink_id for run in self.runs]
        for sink in sinks + [f"{s}.malformed" for s in sinks]:
            done = self._cli("recover", "--sink", sink, "--force")
            assert done.returncode == 0, (sink, done.stderr)
        pending = query(self.url, "SELECT count(*) FROM twophase_epochs WHERE state <> 'COMMITTED'")
        self._wait_retention()
        gc = self._cli(
            "gc",
            "--yes",
            TWOPHASE_RETENTION=f"{RETENTION_S}s",
            TWOPHASE_ORPHAN_GRACE=f"{RETENTION_S}s",
        )
        assert gc.returncode == 0, gc.stderr
        chunks = int(query(self.url, "SELECT count(*) FROM twophase_staged_chunks")[0][0])
        report = [self._sink_report(run) for run in self.runs]
        for entry in report:
            entry["undecided_after_recover"] = int(pending[0][0])  # all sinks
            entry["chunks_after_gc"] = chunks  # all sinks, retention passed
            entry["exact"] = entry["exact"] and not int(pending[0][0]) and not chunks
            entry["exact"] = entry["exact"] and not self.stale
        return report

    def _wait_retention(self) -> None:
        """Until retention (and the orphan grace, the same) has passed since the last
        decision and the last staged write: then gc must leave nothing staged."""
        last = query(
            self.url,
            "SELECT GREATEST((SELECT max(COALESCE(committed_at, aborted_at))"
            " FROM twophase_epochs), (SELECT max(staged_at) FROM twophase_writes))"
            " + make_interval(secs => %s) - now()",
            RETENTION_S + 1,
        )[0][0]
        if last is not None and last.total_seconds() > 0:
            self.log(f"waiting {last.total_seconds():.0f} s for retention to pass")
            time.sleep(last.total_seconds())

    def _sink_report(self, run: SinkRun) -> dict[str, Any]:
        problems = self._problems(run)
        rows = query(
            self.url,
            "SELECT count(*), sum(replays) FROM twophase_epochs WHERE sink_id = %s",
            run.sink_id,
        )
        replays = query(
            self.url,
            "SELECT coalesce(sum(replays_detected), 0) FROM twophase_sinks"
            " WHERE sink_id IN (%s, %s)",
            run.sink_id,
            f"{run.sink_id}.malformed",
        )
        logs = sorted((run.folder / "logs").glob("job-*"))
        outputs = [path.read_text(errors="replace") for path in logs]
        leaked = any(
            secret in text for text in outputs for secret in (PG_PASSWORD, INFLUX_PASSWORD)
        )
        orphans = orphan_writes(self.url, run.sink_id)
        return {
            "sink": run.sink_id,
            "variant": f"{run.stats_writer} {run.env.get('TWOPHASE_PROMOTE_CONNECTIONS', '')}"
            f"{run.env.get('TWOPHASE_PROMOTION', '')}".strip(),
            "events": sum(1 for path in run.files for _ in path.open()),
            "epochs": int(rows[0][0]),
            "replays": int(replays[0][0]),
            "dead_letters": decided_dead_letters(self.url, f"{run.sink_id}.malformed"),
            "recoveries": run.starts - 1,
            "killed": run.harness_kills,
            "failed": len(run.failures),
            "failures": run.failures[-5:],
            "orphans_after_gc": orphans,
            "secret_in_output": leaked,
            "problems": problems[:10],
            "exact": not problems and orphans == 0 and not leaked,
        }

    def secrets_in_cli_output(self) -> bool:
        return any(s in text for text in self.outputs for s in (PG_PASSWORD, INFLUX_PASSWORD))


def write_report(report: Report, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(report) | {"exact": report.exact}, indent=2) + "\n")
