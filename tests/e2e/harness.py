"""Running ``jobs/session_metrics.py`` as a real Spark job that tests can SIGKILL, and
checking what it left in InfluxDB and the staging store.

Each job runs in a session of its own (``start_new_session``), so "kill the
driver" means SIGKILL to every process of that session at once: the Python
driver, the JVM, Spark's Python daemons and workers -- a power cut, with no
``abort`` and no shutdown hook. Crash points do the same from inside: a
plan file (``TWOPHASE_CRASH_PLAN``, see ``twophase/faults.py``) armed while
the job runs, with scope ``session``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy.engine import URL, make_url

from jobs.generate_events import expected
from tests.support import REPO, admin_conninfo, influx_rows
from twophase.config import TargetConfig

JOB = REPO / "jobs" / "session_metrics.py"
# The job's two sinks as the e2e tests name them: the stats and its dead letters.
SINK = "dash"
MALFORMED = SINK + ".malformed"
SINKS = (SINK, MALFORMED)
MEASUREMENT = "stream_stats"
MASTER = "local[2,4]"  # two cores; a failed task is retried up to 4 times
START_TIMEOUT_S = 180.0
KILL_TIMEOUT_S = 120.0  # for an armed crash point to fire once its input is fed
JOB_TIMEOUT_S = 300.0
EXACT_FIELDS = ("events", "bytes_p2p", "bytes_cdn")
Key = tuple[int, str, str]  # (window end in epoch seconds, stream_id, isp)
STARTED: list[Job] = []  # every job started by this process, for kill_leftovers()


@dataclass(frozen=True)
class Target:
    """Where a job writes: one staging database and one InfluxDB database."""

    staging_url: str
    influx: TargetConfig

    def env(self, **extra: str) -> dict[str, str]:
        """The job's environment: its servers, small InfluxDB batches, no crash armed."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("TWOPHASE_CRASH")}
        env.update(
            TWOPHASE_STAGING_URL=self.staging_url,
            TWOPHASE_TARGET_URL=self.influx.url,
            TWOPHASE_INFLUX_API="v1",
            TWOPHASE_INFLUX_DB=str(self.influx.influxdb.database),
            TWOPHASE_TARGET_BATCH_POINTS="5",  # several InfluxDB requests per epoch
            TWOPHASE_TARGET_RETRY_DEADLINE="60s",
            PYSPARK_PYTHON=sys.executable,
            PYTHONFAULTHANDLER="1",
        )
        env.update(extra)
        return env


class Job:
    """One started job: its process (the session leader), its output files."""

    def __init__(self, proc: subprocess.Popen[bytes], out: Path, err: Path, started: float):
        self.proc = proc
        self.out = out
        self.err = err
        self.started = started

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def records(self, kind: str) -> list[dict[str, Any]]:
        """The job's ``KIND {json}`` lines so far."""
        found = []
        for line in self.out.read_text(errors="replace").splitlines():
            if line.startswith(kind + " "):
                found.append(json.loads(line[len(kind) + 1 :]))
        return found

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def wait(self, timeout: float = JOB_TIMEOUT_S) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            # Where it hangs: the driver's Python dumps its threads' stacks on SIGABRT.
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                os.kill(self.proc.pid, signal.SIGABRT)
                self.proc.wait(5)
            self.kill()
            raise AssertionError(f"job still running after {timeout:g}s:\n{self.tail()}") from None

    def wait_for(
        self,
        what: str,
        ready: Callable[[], bool],
        timeout: float = START_TIMEOUT_S,
        interval: float = 0.2,
    ) -> None:
        """Poll ``ready`` until true; fail (killing the job) if it exits or times out."""
        deadline = time.monotonic() + timeout
        while not ready():
            if self.returncode is not None:
                raise AssertionError(
                    f"job exited ({self.returncode}) before {what}:\n{self.tail()}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"no {what} within {timeout:g}s:\n{self.tail()}")
            time.sleep(interval)

    def kill(self) -> None:
        """SIGKILL every process of the job's session (the driver and all it started)."""
        kill_session(self.proc.pid)
        self.proc.wait(30)

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.stderr().splitlines()[-lines:])


def kill_session(sid: int) -> None:
    """SIGKILL the processes of session ``sid`` until none is left."""
    for _ in range(50):
        members = session_members(sid)
        if not members:
            return
        for pid in members:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def session_members(sid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(b")", 1)[1].split()
        if int(fields[3]) == sid and fields[0] not in (b"Z", b"X"):
            pids.append(int(entry))
    return pids


def start_job(
    target: Target,
    input_dir: Path,
    checkpoint: Path,
    sink_id: str,
    logs: Path,
    *,
    available_now: bool = True,
    max_files: int = 1,
    master: str = MASTER,
    stats_writer: str = "foreach-batch",
    crash_plan: Path | None = None,
    extra_args: Sequence[str] = (),
    launcher: Sequence[str] | None = None,
    cwd: Path | str = REPO,
    **env: str,
) -> Job:
    """Start ``python jobs/session_metrics.py`` in a new session; returns at once.

    ``launcher`` replaces ``python`` (``spark-submit --master spark://...``: the
    job's ``--master`` is then left out, as spark-submit's applies).
    With ``crash_plan``, crash points can be armed while it runs (:func:`arm`).
    The driver commits the stats' epoch, then the dead-letter sink's: a driver
    crash point fires in the stats' steps first, unless the plan names a sink.
    """
    if crash_plan is not None:
        env["TWOPHASE_CRASH_PLAN"] = str(crash_plan)
    logs.mkdir(parents=True, exist_ok=True)
    stamp = f"{time.monotonic_ns()}"
    out, err = logs / f"job-{stamp}.out", logs / f"job-{stamp}.err"
    trigger = ["--available-now"] if available_now else ["--trigger-interval", "500 milliseconds"]
    masters = ["--master", master] if launcher is None else []
    cmd = [
        *(launcher or [sys.executable]),
        str(JOB),
        "--input",
        str(input_dir),
        "--checkpoint",
        str(checkpoint),
        "--sink-id",
        sink_id,
        "--max-files-per-trigger",
        str(max_files),
        *masters,
        "--stats-writer",
        stats_writer,
        "--conf",
        "spark.ui.enabled=false",
        *trigger,
        *extra_args,
    ]
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=target.env(**env),
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
    job = Job(proc, out, err, time.monotonic())
    STARTED.append(job)
    return job


def kill_leftovers() -> None:
    """SIGKILL every job a test started and left running (after a failed assertion)."""
    while STARTED:
        job = STARTED.pop()
        kill_session(job.proc.pid)
        job.proc.wait(30)


def run_job(*args: Any, timeout: float = JOB_TIMEOUT_S, **kwargs: Any) -> Job:
    """Start a job and wait for it to end (normally, or by a crash point's SIGKILL)."""
    job = start_job(*args, **kwargs)
    job.wait(timeout)
    kill_session(job.proc.pid)  # leftovers of a killed job (none after a clean exit)
    return job


def arm(
    plan: Path,
    at: str,
    scope: str = "session",
    sink: str | None = None,
    pause_s: float | None = None,
) -> None:
    """Arm a crash point in the running job(s) reading ``plan``: fires once, in the steps
    of ``sink`` when one is named. With ``pause_s`` the process sleeps there instead."""
    disarm(plan)
    hidden = plan.with_name(plan.name + ".tmp")
    armed: dict[str, Any] = {"at": at, "scope": scope}
    armed |= ({"sink": sink} if sink else {}) | ({"pause_s": pause_s} if pause_s else {})
    hidden.write_text(json.dumps(armed))
    hidden.replace(plan)


def disarm(plan: Path) -> None:
    plan.unlink(missing_ok=True)
    fired(plan).unlink(missing_ok=True)


def fired(plan: Path) -> Path:
    """The marker twophase.faults creates when the armed point fires."""
    return plan.with_name(plan.name + ".fired")


def feed(input_dir: Path, files: Iterable[Path]) -> None:
    """Copy event files into the job's input as Spark expects: whole, in order."""
    input_dir.mkdir(parents=True, exist_ok=True)
    for source in files:
        hidden = input_dir / f".{source.name}.tmp"
        shutil.copy2(source, hidden)
        hidden.replace(input_dir / source.name)


# --- checks -------------------------------------------------------------------------------


def influx_stats(influx: TargetConfig) -> dict[Key, dict[str, Any]]:
    """Every stream_stats point: key -> fields."""
    stats = {}
    for time_ns, tags, fields in influx_rows(influx, MEASUREMENT):
        tag = dict(tags)
        key = (time_ns // 1_000_000_000, tag["stream_id"], tag["isp"])
        assert key not in stats, f"two points for {key}"
        stats[key] = dict(fields)
    return stats


def expected_stats(files: Iterable[Path]) -> dict[Key, dict[str, int]]:
    """What a crash-free run writes, computed from the files without Spark."""
    return {
        key: {"events": t.events, "bytes_p2p": t.bytes_p2p, "bytes_cdn": t.bytes_cdn}
        for key, t in expected(files).stats.items()
    }


Reader = Callable[[TargetConfig], dict[Key, dict[str, Any]]]


def mismatches(
    influx: TargetConfig, files: Sequence[Path], read: Reader = influx_stats
) -> list[str]:
    """Differences between InfluxDB and the expected aggregates (empty: exact); ``read``
    gives what InfluxDB holds by key (the job's default measurement unless told)."""
    want, got = expected_stats(files), read(influx)
    problems = [f"missing {key}" for key in sorted(set(want) - set(got))]
    problems += [f"extra {key}: {got[key]}" for key in sorted(set(got) - set(want))]
    for key in sorted(set(want) & set(got)):
        for name in EXACT_FIELDS:
            if got[key].get(name) != want[key][name]:
                problems.append(
                    f"{key} {name}: InfluxDB {got[key].get(name)}, expected {want[key][name]}"
                )
    return problems


def wait_exact(
    job: Job,
    target: Target,
    files: Sequence[Path],
    malformed_sink: str,
    timeout: float = START_TIMEOUT_S,
    read: Reader = influx_stats,
) -> None:
    """Wait until the running job has made InfluxDB and the dead letters exact (the
    first moment they are: see ``assert_exact`` for a read once the job settled)."""
    problems: list[str] = []

    def exact() -> bool:
        nonlocal problems
        problems = differences(target, files, malformed_sink, read)
        return not problems

    try:
        job.wait_for("exact results", exact, timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nlast differences: {problems[:10]}") from None


def differences(
    target: Target, files: Sequence[Path], malformed_sink: str, read: Reader = influx_stats
) -> list[str]:
    """What InfluxDB and the dead letters hold that a crash-free run of ``files`` would
    not (empty: exact)."""
    want_malformed = expected(files).malformed
    problems = mismatches(target.influx, files, read)
    dead = decided_dead_letters(target.staging_url, malformed_sink)
    if dead != want_malformed:
        problems.append(f"{dead} malformed lines dead-lettered, expected {want_malformed}")
    return problems


def assert_exact(
    target: Target, files: Sequence[Path], malformed_sink: str, read: Reader = influx_stats
) -> None:
    """InfluxDB and the dead letters exact, read once: after the epochs a kill left in
    flight ran again, what they wrote must still be exact (not only exact once while
    the job polled)."""
    problems = differences(target, files, malformed_sink, read)
    assert not problems, f"not exact after the re-run: {problems[:10]}"


def query(url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(admin_conninfo(url)) as conn:
        return conn.execute(sql, params).fetchall()


def epochs(url: str, sink_id: str) -> list[dict[str, Any]]:
    """The sink's epochs in order, with state, replay and promotion counters."""
    rows = query(
        url,
        "SELECT epoch, state, replays, promote_attempts, points_staged, cardinality(write_ids),"
        " query_id FROM twophase_epochs WHERE sink_id = %s ORDER BY epoch",
        sink_id,
    )
    keys = ("epoch", "state", "replays", "promote_attempts", "points", "writes", "query_id")
    return [dict(zip(keys, row, strict=True)) for row in rows]


def decided_dead_letters(url: str, sink_id: str) -> int:
    """Dead letters of the writes the sink's epochs chose (orphans' copies excluded)."""
    rows = query(
        url,
        "SELECT count(*) FROM twophase_dead_letters d JOIN twophase_epochs e"
        " ON e.sink_id = d.sink_id AND e.epoch = d.epoch AND d.write_id = ANY(e.write_ids)"
        " WHERE d.sink_id = %s",
        sink_id,
    )
    return int(rows[0][0])


def staged_lanes(url: str, sink_id: str) -> set[int]:
    """The lanes the sink's decided writes were staged in."""
    rows = query(
        url,
        "SELECT DISTINCT c.lane FROM twophase_staged_chunks c JOIN twophase_epochs e"
        " ON c.write_id = ANY(e.write_ids) WHERE e.sink_id = %s",
        sink_id,
    )
    return {int(row[0]) for row in rows}


_UNDECIDED = (
    "SELECT count(*) FROM twophase_writes w WHERE NOT EXISTS (SELECT 1 FROM"
    " twophase_epochs e WHERE e.sink_id = w.sink_id AND e.epoch = w.epoch)"
)


def undecided_writes(conn: psycopg.Connection[Any]) -> int:
    """Staged writes of epochs not decided yet (being staged, or orphans of a crash)."""
    row = conn.execute(_UNDECIDED).fetchone()
    return int(row[0]) if row else 0


def orphan_writes(url: str, sink_id: str | None = None) -> int:
    """Staged writes that no decision names (failed, replayed or killed attempts)."""
    rows = query(
        url,
        "SELECT count(*) FROM twophase_writes w LEFT JOIN twophase_epochs e"
        " ON e.sink_id = w.sink_id AND e.epoch = w.epoch"
        " WHERE (e.epoch IS NULL OR NOT (w.write_id = ANY(e.write_ids)))"
        " AND (%s::text IS NULL OR w.sink_id = %s)",
        sink_id,
        sink_id,
    )
    return int(rows[0][0])


def wait_idle(job: Job, url: str, sink: str, timeout: float = START_TIMEOUT_S) -> None:
    """Until the stats query has run the no-data batch that follows a data batch (Spark
    runs one to advance the watermark; its epoch has no point) and waits for input.
    Armed then, a crash point fires in the next data epoch, not in an empty one."""

    def idle() -> bool:
        progress = [p for p in job.records("PROGRESS") if p["query"] == "stats"]
        rows = epochs(url, sink)
        return (
            bool(progress)
            and progress[-1]["input_rows"] == 0
            and progress[-1]["batch"] >= max((row["epoch"] for row in rows), default=-1)
            and all(row["state"] == "COMMITTED" for row in rows)
        )

    job.wait_for("the stats query to be idle", idle, timeout)


def without_password(staging_url: str) -> str:
    """The URL as a sink option may hold it (the password comes from PGPASSWORD)."""
    url = make_url(staging_url)
    return URL.create(
        url.drivername, url.username, None, url.host, url.port, url.database
    ).render_as_string()
