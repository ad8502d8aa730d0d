"""Two kinds of target, with real Spark: the seeds' job delivers each epoch exactly once
to ``influx`` (the dev InfluxDB) and to ``pg`` (a fresh PostgreSQL database whose table
the job creates, ``target_create_tables``), each behind a fault proxy of its own.

The driver is SIGKILLed inside pg's transaction (the epoch's rows sent, not committed)
and just after pg committed (the staging store not told yet), and restarted each time:
the restart sends the first epoch again, and finds the second in pg's record, sending
nothing. Then pg is cut off while the driver is killed once more, after a decision, and
input keeps coming: the query runs on, InfluxDB gets each epoch, pg lags and catches up
once it answers again. Then InfluxDB is cut off in turn: pg goes on, InfluxDB lags and
catches up. At the end both hold exactly the aggregates computed without Spark, pg's
record names each epoch once, and a reader polling pg's table the whole time never saw
part of an epoch: each snapshot it took sums to the events of whole input files (one
file per epoch), and a snapshot's last recorded epoch always comes with the same rows.

One job start, one restart per kill. ``--full`` adds kills at the other steps of a
delivery (mid-promotion, recording a delivery, the mark, after the mark).

A deliberate reset, as the operations pages say: the job runs input A, the user starts
it again with a new checkpoint after ``twophase reset`` of its two sinks, and the new
query (its epochs numbered from 0 again) runs input B. Both targets hold A's and B's
aggregates: pg's record of A's epochs, out of the reset's reach, is of the sink's old
generation and skips none of B's. Two job starts.
"""

from __future__ import annotations

import datetime as dt
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

from devkit.faultproxy import CUT, PASS, FaultProxy
from jobs.generate_events import expected
from tests.e2e.harness import (
    EXACT_FIELDS,
    KILL_TIMEOUT_S,
    MALFORMED,
    MEASUREMENT,
    SINK,
    Job,
    Key,
    Target,
    arm,
    decided_dead_letters,
    disarm,
    epochs,
    expected_stats,
    fired,
    influx_stats,
    kill_session,
    mismatches,
    query,
    run_job,
    start_job,
    wait_exact,
    wait_idle,
)
from tests.e2e.harness import feed as copy_files
from tests.support import admin_conninfo, create_database, drop_database, unique
from twophase.config import TargetConfig

NAMES = ("influx", "pg")
RECORD_TABLE = "twophase_delivered"  # pg's own record of the epochs it holds
EXACT_TIMEOUT_S = 150.0
OUTAGE_S = 15.0  # at least, each target
READ_INTERVAL_S = 0.02
# Where the driver dies in the default run: in pg's transaction, then between pg's
# commit and the staging store's record of it. after_decide is done during pg's outage.
KILLS = ("before_target_commit", "after_target_commit")
FULL_KILLS = (*KILLS, "promote_batch", "in_deliver", "in_mark", "after_mark")
UNIX_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
# What a delivery logs when pg's record says it holds the epoch already (nothing sent).
HELD = re.compile(rf"sink {re.escape(SINK)} epoch \d+: target pg holds it already")


@dataclass(frozen=True)
class TwoKinds(Target):
    """The job's servers: TWOPHASE_TARGETS instead of TWOPHASE_TARGET_URL (setting both
    is refused); ``influx`` is the InfluxDB target's database, read directly."""

    fan: tuple[tuple[str, str], ...] = ()

    def env(self, **extra: str) -> dict[str, str]:
        env = super().env()
        del env["TWOPHASE_TARGET_URL"]
        return env | dict(self.fan) | extra


@dataclass(frozen=True)
class Servers:
    target: TwoKinds
    pg_admin: str  # pg's database, read directly (not through its proxy), password inside
    influx_proxy: FaultProxy
    pg_proxy: FaultProxy


@pytest.fixture
def servers(staging_url: str, base_staging_url: str, influx: TargetConfig) -> Iterator[Servers]:
    name = unique("tp_pg_target")
    create_database(base_staging_url, name)
    base = make_url(base_staging_url)
    influx_proxy = FaultProxy.for_url(influx.url).start()
    pg_proxy = FaultProxy(base.host or "", base.port or 5432).start()
    settings = {
        "TWOPHASE_TARGETS": (
            f"influx={influx_proxy.url},"
            f"pg=postgresql://{base.username}@127.0.0.1:{pg_proxy.port}/{name}"
        ),
        # the password of pg alone, never in its URL
        "TWOPHASE_TARGET_PG_TARGET_PASSWORD": base.password or "",
        "TWOPHASE_TARGET_CREATE_TABLES": "true",
        "TWOPHASE_TARGET_DEADLINE": "2s",
        "TWOPHASE_MIN_TARGETS": "1",
        "TWOPHASE_TARGET_RETRY_MAX": "1s",  # a target's catch-up resumes within a second
    }
    target = TwoKinds(staging_url, influx, tuple(settings.items()))
    try:
        yield Servers(target, admin_conninfo(base_staging_url, name), influx_proxy, pg_proxy)
    finally:
        influx_proxy.stop()
        pg_proxy.stop()
        drop_database(base_staging_url, name)


# --- pg read -------------------------------------------------------------------------------


def pg_sql(servers: Servers, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(servers.pg_admin, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def pg_stats(servers: Servers) -> dict[Key, dict[str, Any]]:
    """Every row of pg's stream_stats table: key -> fields (none before its first epoch).
    The key's time is the row's, kept to the microsecond: whole seconds, as the job
    writes them, or the row is reported."""
    try:
        rows = pg_sql(
            servers,
            f"SELECT time, stream_id, isp, {', '.join(EXACT_FIELDS)} FROM {MEASUREMENT}",  # noqa: S608
        )
    except psycopg.errors.UndefinedTable:
        return {}
    stats: dict[Key, dict[str, Any]] = {}
    for time_, stream_id, isp, *values in rows:
        micros = (time_ - UNIX_EPOCH) // dt.timedelta(microseconds=1)
        seconds, left = divmod(micros, 1_000_000)
        key = (seconds, stream_id, isp)
        assert not left, f"{key}: a time of {micros} us, not a whole second"
        assert key not in stats, f"two rows for {key}"  # the table's unique key forbids it
        stats[key] = dict(zip(EXACT_FIELDS, values, strict=True))
    return stats


def pg_mismatches(servers: Servers, files: Sequence[Path]) -> list[str]:
    want, got = expected_stats(files), pg_stats(servers)
    return [
        f"{key}: pg {got.get(key)}, expected {want.get(key)}"
        for key in sorted(set(want) | set(got))
        if got.get(key) != want.get(key)
    ]


def pg_records(servers: Servers) -> list[tuple[str, str, int]]:
    return [
        (str(s), str(t), int(e))
        for s, t, e in pg_sql(
            servers,
            f"SELECT sink_id, target, epoch FROM {RECORD_TABLE} ORDER BY epoch",  # noqa: S608
        )
    ]


# --- the reader that must never see part of an epoch ------------------------------------------

# One statement, one snapshot: the rows' count and events, and the last epoch recorded.
_SNAPSHOT = (
    f"SELECT (SELECT count(*) FROM {MEASUREMENT}),"  # noqa: S608
    f" (SELECT coalesce(sum(events), 0) FROM {MEASUREMENT}),"
    f" (SELECT coalesce(max(epoch), -1) FROM {RECORD_TABLE} WHERE sink_id = %s)"
)


class Reader:
    """A thread reading pg's table in a loop, directly (not through the proxy, so it goes
    on through pg's outage): each snapshot's (rows, events, last epoch recorded)."""

    def __init__(self, admin: str) -> None:
        self.admin = admin
        self.seen: set[tuple[int, int, int]] = set()
        self.reads = 0
        self.failure: BaseException | None = None
        self.stop = threading.Event()

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="pg-reader", daemon=True)
        thread.start()
        return thread

    def _run(self) -> None:
        try:
            with psycopg.connect(self.admin, autocommit=True) as conn:
                while not self.stop.wait(READ_INTERVAL_S):
                    self._read(conn)
        except BaseException as exc:  # reported by the test, in its thread
            self.failure = exc

    def _read(self, conn: psycopg.Connection[Any]) -> None:
        try:
            row = conn.execute(_SNAPSHOT, (SINK,)).fetchone()
        except psycopg.errors.UndefinedTable:  # no epoch committed on pg yet
            return
        assert row is not None
        self.seen.add((int(row[0]), int(row[1]), int(row[2])))
        self.reads += 1


def whole_file_sums(files: Sequence[Path]) -> set[int]:
    """The events pg's table sums to after each epoch: with one file per epoch, the
    good events of the first k files fed (none is late, so Spark drops none)."""
    return {
        sum(t.events for t in expected(files[:k]).stats.values()) for k in range(len(files) + 1)
    }


def reader_saw_whole_epochs(reader: Reader, files: Sequence[Path]) -> str:
    """Each snapshot held whole epochs: its events a sum of whole files, and the same rows
    with each last recorded epoch (a part of an epoch would show beside its record, or
    before it, as another sum)."""
    assert reader.failure is None, repr(reader.failure)
    allowed = whole_file_sums(files)
    partial = sorted(s for s in reader.seen if s[1] not in allowed)
    assert not partial, f"snapshots with part of an epoch: {partial[:5]}"
    by_epoch: dict[int, set[tuple[int, int]]] = {}
    for rows, events, epoch in reader.seen:
        by_epoch.setdefault(epoch, set()).add((rows, events))
    torn = {epoch: sums for epoch, sums in by_epoch.items() if len(sums) > 1}
    assert not torn, f"one recorded epoch, several tables: {torn}"
    states = {events for _, events, _ in reader.seen}
    assert len(states) > len(files) // 2, f"the reader saw too few epochs: {sorted(states)}"
    return f"{reader.reads} reads, {len(states)} states"


# --- the run -------------------------------------------------------------------------------


class Run:
    """The stats job, restarted after each kill; remembers the input it was given (one
    file per epoch)."""

    def __init__(self, servers: Servers, work: Path, event_files: Sequence[Path]) -> None:
        self.servers = servers
        self.work = work
        self.url = servers.target.staging_url
        self.pending = list(event_files)
        self.fed: list[Path] = []
        self.plan = work / "crash-plan.json"
        self.starts = 0
        self.job = self.start()

    def start(self) -> Job:
        # The crash points fire in the driver, where the epochs are decided and delivered;
        # the Python workers get a plan that never exists.
        never = self.work / "workers-never-crash.json"
        self.starts += 1
        return start_job(
            self.servers.target,
            self.work / "input",
            self.work / "checkpoint",
            SINK,
            self.work / "logs",
            available_now=False,
            max_files=1,
            crash_plan=self.plan,
            extra_args=["--conf", f"spark.executorEnv.TWOPHASE_CRASH_PLAN={never}"],
        )

    def feed(self) -> None:
        assert self.pending, "out of event files"
        new, self.pending = self.pending[:1], self.pending[1:]
        self.fed += new
        copy_files(self.work / "input", new)

    def kill_at(self, point: str) -> Job:
        """Armed while idle, ``point`` fires in the next data epoch of the stats sink: the
        whole driver is SIGKILLed there; then the job is started again. Returns the
        killed job."""
        wait_idle(self.job, self.url, SINK)
        arm(self.plan, point, sink=SINK)
        self.feed()
        killed = self.job
        code = killed.wait(KILL_TIMEOUT_S)
        kill_session(killed.proc.pid)
        assert code == -signal.SIGKILL, (point, killed.tail())
        assert fired(self.plan).exists(), point
        disarm(self.plan)
        self.job = self.start()
        return killed

    def wait_influx(self) -> None:
        wait_exact(self.job, self.servers.target, self.fed, MALFORMED, EXACT_TIMEOUT_S)

    def wait_pg(self) -> None:
        problems: list[str] = []

        def exact() -> bool:
            nonlocal problems
            problems = pg_mismatches(self.servers, self.fed)
            return not problems

        try:
            self.job.wait_for("pg exact", exact, EXACT_TIMEOUT_S, interval=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nlast differences: {problems[:10]}") from None

    def wait_both(self) -> None:
        self.wait_influx()
        self.wait_pg()

    def wait_dead_letters(self) -> None:
        want = expected(self.fed).malformed
        self.job.wait_for(
            "the dead letters",
            lambda: decided_dead_letters(self.url, MALFORMED) == want,
            EXACT_TIMEOUT_S,
        )


def run_scenario(
    servers: Servers, work: Path, event_files: list[Path], kills: Sequence[str]
) -> str:
    started = time.monotonic()
    reader = Reader(servers.pg_admin)
    thread = reader.start()
    try:
        run = Run(servers, work, event_files)
        run.feed()
        run.wait_both()
        kills_and_restarts(run, kills)
        pg_lag = pg_down_through_a_kill(run)
        influx_lag = influx_down(run)
    finally:
        reader.stop.set()
        thread.join(10)
    both_exact_each_epoch_once(run)
    read = reader_saw_whole_epochs(reader, run.fed)
    return (
        f"{len(run.fed)} epochs of data, {run.starts} job starts, pg lagged {pg_lag} epochs, "
        f"influx {influx_lag}; reader: {read}; {time.monotonic() - started:.0f}s"
    )


def kills_and_restarts(run: Run, kills: Sequence[str]) -> None:
    """The driver SIGKILLed at each point, restarted: both targets exact after each."""
    for point in kills:
        killed = run.kill_at(point)
        run.wait_both()
        if point == "after_target_commit":
            # the restart found the epoch in pg's record and did not send it again
            run.job.wait_for("pg's record read", lambda: bool(HELD.search(run.job.stderr())))
            assert not HELD.search(killed.stderr()), killed.tail()


def pg_down_through_a_kill(run: Run) -> int:
    """pg cut off (at least OUTAGE_S) while the driver is killed after a decision and
    input keeps coming: InfluxDB exact, the query running, pg given nothing and lagging;
    then pg answers again and catches up. Returns how many epochs it lagged."""
    servers = run.servers
    before = pg_stats(servers)
    servers.pg_proxy.set_mode(CUT)
    down_since = time.monotonic()
    run.kill_at("after_decide")  # recovered at the restart's claim, pg away
    run.wait_influx()
    run.feed()
    run.wait_influx()
    wait_out(run, down_since)
    assert pg_stats(servers) == before, "pg changed while cut off"
    lag = backlog(run.url, "pg")
    assert lag, "pg is not lagging behind"
    servers.pg_proxy.set_mode(PASS)
    run.wait_pg()
    return len(lag)


def influx_down(run: Run) -> int:
    """InfluxDB cut off (at least OUTAGE_S) while input comes: pg exact, InfluxDB given
    nothing and lagging; then InfluxDB catches up. Returns how many epochs it lagged."""
    servers = run.servers
    before = influx_stats(servers.target.influx)
    servers.influx_proxy.set_mode(CUT)
    down_since = time.monotonic()
    for _ in range(2):
        run.feed()
        run.wait_pg()
    run.wait_dead_letters()
    wait_out(run, down_since)
    assert influx_stats(servers.target.influx) == before, "InfluxDB changed while cut off"
    lag = backlog(run.url, "influx")
    assert lag, "InfluxDB is not lagging behind"
    servers.influx_proxy.set_mode(PASS)
    run.wait_influx()
    return len(lag)


def wait_out(run: Run, since: float) -> None:
    """Until the outage has lasted OUTAGE_S, the job running all along."""
    while time.monotonic() - since < OUTAGE_S:
        assert run.job.returncode is None, run.job.tail()
        time.sleep(0.5)
    assert run.job.returncode is None, run.job.tail()


def backlog(url: str, target: str) -> list[int]:
    """The COMMITTED epochs of the stats sink that a target lacks."""
    rows = query(
        url,
        "SELECT epoch FROM twophase_target_backlog WHERE sink_id = %s AND target = %s"
        " ORDER BY epoch",
        SINK,
        target,
    )
    return [int(row[0]) for row in rows]


def both_exact_each_epoch_once(run: Run) -> None:
    """Both targets hold exactly the aggregates; both cursors on the last COMMITTED epoch;
    pg's record names each epoch with points, and no other, once; the staging store
    recorded each delivery to pg once (those of epochs without points too)."""
    servers, url = run.servers, run.url
    assert not mismatches(servers.target.influx, run.fed)
    assert not pg_mismatches(servers, run.fed)
    rows = epochs(url, SINK)
    assert {row["state"] for row in rows} == {"COMMITTED"}, rows
    last = max(row["epoch"] for row in rows)
    cursors = query(
        url, "SELECT target, state, delivered_epoch FROM twophase_targets WHERE sink_id = %s", SINK
    )
    assert {t: (s, d) for t, s, d in cursors} == {n: ("live", last) for n in NAMES}, cursors
    records = pg_records(servers)  # an epoch without points opens no transaction on pg
    assert {(sink, t) for sink, t, _ in records} == {(SINK, "pg")}, records
    recorded = [epoch for _, _, epoch in records]
    with_points = {row["epoch"] for row in rows if row["points"]}
    assert sorted(recorded) == sorted(with_points), (records, rows)
    delivered = query(
        url,
        "SELECT sink_id, epoch, count(*) FROM twophase_target_deliveries"
        " WHERE sink_id IN (%s, %s) AND target = 'pg' GROUP BY sink_id, epoch",
        SINK,
        MALFORMED,
    )
    once = {(s, int(e)): int(n) for s, e, n in delivered}
    assert set(once.values()) == {1}, delivered  # every epoch, those without points too
    assert {(SINK, epoch) for epoch in recorded} <= set(once), (delivered, records)


# --- the tests -----------------------------------------------------------------------------


def test_influx_and_postgresql_through_kills_and_outages(
    servers: Servers, work: Path, event_files: list[Path]
) -> None:
    print(run_scenario(servers, work, event_files, KILLS))


@pytest.mark.full
def test_influx_and_postgresql_through_kills_at_every_delivery_step(
    servers: Servers, work: Path, event_files: list[Path]
) -> None:
    print(run_scenario(servers, work, event_files, FULL_KILLS))


def twophase_cli(servers: Servers, *args: str) -> subprocess.CompletedProcess[str]:
    """The installed ``twophase`` command, configured as the job is (its environment)."""
    script = Path(sys.executable).with_name("twophase")
    return subprocess.run(
        [str(script), *args],
        env=servers.target.env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_reset_sinks_new_query_reaches_both_targets_whole(
    servers: Servers, work: Path, event_files: list[Path]
) -> None:
    # Windows of five minutes, a file a minute: ten minutes apart, A's and B's windows
    # are others, and each target holds both queries' aggregates side by side.
    a, b = event_files[:2], event_files[12:14]
    assert not set(expected_stats(a)) & set(expected_stats(b))
    for name, files in (("a", a), ("b", b)):
        copy_files(work / f"input-{name}", files)
        if name == "b":  # the checkpoint reset on purpose: its sinks reset as well
            for sink in (SINK, MALFORMED):
                done = twophase_cli(servers, "reset", "--sink", sink, "--yes")
                assert done.returncode == 0, done.stderr
        job = run_job(
            servers.target,
            work / f"input-{name}",
            work / f"checkpoint-{name}",
            SINK,
            work / "logs",
            max_files=1,  # an epoch a file: B's epochs 0 and 1 were A's numbers too
        )
        assert job.returncode == 0, job.tail()
    assert not mismatches(servers.target.influx, [*a, *b])
    assert not pg_mismatches(servers, [*a, *b])
    generations = pg_sql(
        servers,
        f"SELECT generation, array_agg(epoch ORDER BY epoch) FROM {RECORD_TABLE}"  # noqa: S608
        " WHERE sink_id = %s GROUP BY generation ORDER BY generation",
        SINK,
    )
    assert generations == [(0, [0, 1]), (1, [0, 1])], generations
