"""One sink, three targets, with real Spark: the job delivers each epoch exactly once to
``a`` (the dev InfluxDB), ``b`` (an InfluxDB of the test's own behind a fault proxy) and
``vm`` (VictoriaMetrics). ``b`` is cut off for over a minute while input keeps coming and
the driver is SIGKILLed twice (after a decision, mid-promotion) and restarted: ``a`` and
``vm`` keep receiving and the query keeps running; ``b`` is left lagging and gets
nothing; ``twophase status`` shows it lagging. Then ``b`` answers again, slowly: the
job's catch-up worker starts on its backlog, the job is stopped part-way, and
``twophase recover`` delivers the rest in epoch order. All three targets hold exactly
the aggregates computed without Spark, every target's cursor is on the last epoch, and
``b`` was sent each epoch it missed once (but the one the stop cut).

VictoriaMetrics is a server of the test's own, started without
``-dedup.minScrapeInterval``: it keeps every sample it is sent rather than overwriting a
point, so its samples count what it was sent, re-sent epochs too (the dev server runs
with deduplication, which would count them once). It is written through its InfluxDB v1
``/write``, which labels each point with the ``db`` it names.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import urllib3

from devkit.faultproxy import CUT, PASS, FaultProxy
from devkit.ports import start_own_influx, start_own_victoria_metrics
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
    disarm,
    epochs,
    expected_stats,
    fired,
    influx_stats,
    kill_session,
    mismatches,
    query,
    start_job,
    wait_exact,
    wait_idle,
)
from tests.e2e.harness import feed as copy_files
from tests.integration.cli_helpers import make_cli
from tests.support import unique
from twophase.config import InfluxDBSettings, TargetConfig

NAMES = ("a", "b", "vm")
B_DATABASE = "e2e"  # b's database, on the test's own influxd
FILES_PER_STEP = 2  # with --max-files-per-trigger 2: one data epoch per step
OUTAGE_S = 70.0  # at least; b stays down until both kills are done too
EXACT_TIMEOUT_S = 150.0
SLOW_ANSWER_S = 1.0  # b's delay per answer once back: its catch-up takes ~10 s


@dataclass(frozen=True)
class FanTarget(Target):
    """The job's servers as targets: TWOPHASE_TARGETS replaces TWOPHASE_TARGET_URL
    (setting both is refused); ``influx`` is target a's, the shared settings'."""

    fan: tuple[tuple[str, str], ...] = ()

    def env(self, **extra: str) -> dict[str, str]:
        env = super().env()
        del env["TWOPHASE_TARGET_URL"]
        return env | dict(self.fan) | extra


@dataclass(frozen=True)
class Fan:
    target: FanTarget
    b: TargetConfig  # b's database read directly, not through the proxy
    proxy: FaultProxy  # in front of b
    vm_url: str
    vm_db: str  # the db label of this test's points in VictoriaMetrics


@pytest.fixture
def fan(staging_url: str, influx: TargetConfig, tmp_path: Path) -> Iterator[Fan]:
    server = start_own_influx(tmp_path, B_DATABASE)
    vm = start_own_victoria_metrics(tmp_path, dedup_interval=None)  # keeps every sample
    vm_url = vm.url
    proxy = FaultProxy.for_url(server.url).start()
    vm_db = unique("tpvm")
    settings = {
        "TWOPHASE_TARGETS": f"a={influx.url},b={proxy.url},vm={vm_url}",
        "TWOPHASE_TARGET_B_INFLUX_DB": B_DATABASE,
        "TWOPHASE_TARGET_VM_INFLUX_DB": vm_db,
        "TWOPHASE_TARGET_DEADLINE": "2s",
        "TWOPHASE_MIN_TARGETS": "1",
        "TWOPHASE_TARGET_RETRY_MAX": "1s",  # b's catch-up resumes within a second of its return
    }
    b = TargetConfig(url=server.url, influxdb=InfluxDBSettings(api="v1", database=B_DATABASE))
    try:
        yield Fan(FanTarget(staging_url, influx, tuple(settings.items())), b, proxy, vm_url, vm_db)
    finally:
        proxy.stop()
        server.stop()
        vm.stop()


class Run:
    """The stats job, restarted after each kill; remembers the input it was given."""

    def __init__(self, fan: Fan, work: Path, event_files: Sequence[Path]) -> None:
        self.fan = fan
        self.work = work
        self.url = fan.target.staging_url
        self.pending = list(event_files)
        self.fed: list[Path] = []
        self.plan = work / "crash-plan.json"
        self.job = self.start()

    def start(self) -> Job:
        # The crash points fire in the driver, where the epochs are decided and promoted;
        # the Python workers get a plan that never exists.
        never = self.work / "workers-never-crash.json"
        return start_job(
            self.fan.target,
            self.work / "input",
            self.work / "checkpoint",
            SINK,
            self.work / "logs",
            available_now=False,
            max_files=2,
            crash_plan=self.plan,
            extra_args=["--conf", f"spark.executorEnv.TWOPHASE_CRASH_PLAN={never}"],
        )

    def feed(self) -> None:
        new, self.pending = self.pending[:FILES_PER_STEP], self.pending[FILES_PER_STEP:]
        self.fed += new
        copy_files(self.work / "input", new)

    def kill_at(self, point: str) -> None:
        """Armed while idle, ``point`` fires in the next data epoch of the stats sink: the
        whole driver is SIGKILLed there; then the job is started again."""
        wait_idle(self.job, self.url, SINK)
        arm(self.plan, point, sink=SINK)
        self.feed()
        code = self.job.wait(KILL_TIMEOUT_S)
        kill_session(self.job.proc.pid)
        assert code == -signal.SIGKILL, (point, self.job.tail())
        assert fired(self.plan).exists(), point
        disarm(self.plan)
        self.job = self.start()

    def wait_a_and_vm(self) -> None:
        wait_exact(self.job, self.fan.target, self.fed, MALFORMED, EXACT_TIMEOUT_S)
        self.wait_for("VictoriaMetrics exact", lambda: not vm_mismatches(self.fan, self.fed))

    def wait_for(self, what: str, ready: Callable[[], bool]) -> None:
        self.job.wait_for(what, ready, EXACT_TIMEOUT_S, interval=0.5)


def test_three_targets_one_down_through_driver_kills_then_recover(
    fan: Fan, work: Path, event_files: list[Path]
) -> None:
    started = time.monotonic()
    run = Run(fan, work, event_files)
    run.feed()
    run.wait_a_and_vm()
    run.wait_for("b exact", lambda: not mismatches(fan.b, run.fed))
    outage_s, while_down = b_down_through_two_kills(run)
    had = cursor(fan, "b")  # read while b is still cut off
    after_return = bring_b_back_slowly(run)
    left, reported = stop_and_recover(run)
    all_targets_exact(fan, run.fed)
    owed = b_got_each_epoch_once(fan, had)
    print(
        f"b down {outage_s:.0f}s, {while_down}, owed epochs {owed}; right after its return "
        f"{after_return}; recover: b lacked {left}, reported {reported}; "
        f"{time.monotonic() - started:.0f}s"
    )
    # recover reports each epoch it delivered to a lagging target
    assert reported == [(SINK, "b", epoch) for epoch in left], (left, reported)


def b_down_through_two_kills(run: Run) -> tuple[float, str]:
    """b cut off (at least OUTAGE_S) while input comes and the driver is killed twice:
    a and vm exact after each restart, the last job still running, b given nothing and
    shown lagging. Returns how long b has been down, and its status."""
    fan = run.fan
    b_before = influx_stats(fan.b)
    fan.proxy.set_mode(CUT)
    down_since = time.monotonic()
    run.kill_at("after_decide")  # recovered at the restart's claim: b left lagging
    run.wait_a_and_vm()
    run.kill_at("promote_batch")
    run.wait_a_and_vm()
    run.feed()  # and the restarted driver carries on without b
    run.wait_a_and_vm()
    while time.monotonic() - down_since < OUTAGE_S:
        assert run.job.returncode is None, run.job.tail()
        time.sleep(1.0)
    assert run.job.returncode is None, run.job.tail()
    assert influx_stats(fan.b) == b_before  # b got nothing while cut off
    return time.monotonic() - down_since, status_while_b_is_down(fan)


def bring_b_back_slowly(run: Run) -> str:
    """b answers again, each answer a second late (a far link): the job's catch-up
    worker delivers its backlog, but slowly enough that status sees b behind and the
    job is stopped before it is done, leaving ``twophase recover`` the rest."""
    run.fan.proxy.reset_counts()
    run.fan.proxy.delay_s = SLOW_ANSWER_S
    run.fan.proxy.set_mode(PASS)
    run.wait_a_and_vm()
    return status_after_b_returned(run.fan)


def stop_and_recover(run: Run) -> tuple[list[int], list[tuple[str, str, int]]]:
    """SIGKILL the job (its run looks live afterwards: recover needs --force), then
    ``twophase recover``. Returns the epochs b lacked, and what recover reports it
    delivered to lagging targets: (sink, target, epoch) each."""
    run.job.kill()
    left = backlog(run.fan, "b")
    assert left, "the job's catch-up was done before the stop: recover has nothing to do"
    run.fan.proxy.delay_s = 0.0
    return left, recover(run.fan)


def status_while_b_is_down(fan: Fan) -> str:
    """``twophase status``: the three targets, a and vm caught up, b lagging behind."""
    shown = shown_targets(fan)
    b = shown["b"]
    assert b["state"] == "lagging" and b["lag_epochs"] > 0, shown
    for key in ("lag_seconds", "lag_bytes"):  # status shows them; the table has none
        if key in b:
            assert b[key] > 0, shown
    return f"lagging {b['lag_epochs']} epochs"


def status_after_b_returned(fan: Fan) -> str:
    """b back, its answers slow: still lagging, its backlog being delivered."""
    shown = shown_targets(fan)
    b = shown["b"]
    assert b["state"] == "lagging" and b["lag_epochs"] > 0, shown
    return f"still lagging {b['lag_epochs']} epochs"


def shown_targets(fan: Fan) -> dict[str, dict[str, Any]]:
    """The stats sink's targets as ``twophase status --json`` shows them (from the store
    while status does not show targets yet): the three, a and vm caught up."""
    done = cli_run(fan, "status", "--sink", SINK, "--json")
    assert done.code == 0, done.err
    (sink,) = done.json()["sinks"]
    shown = {t["target"]: t for t in sink.get("targets") or []} or stored_targets(fan)
    assert set(shown) == set(NAMES), shown
    for name in ("a", "vm"):
        assert (shown[name]["state"], shown[name]["lag_epochs"]) == ("live", 0), shown
    return shown


def stored_targets(fan: Fan) -> dict[str, dict[str, Any]]:
    """The targets from the store: ``twophase_targets`` and the backlog view."""
    print("twophase status --json shows no targets yet: read from twophase_targets")
    rows = query(
        fan.target.staging_url,
        "SELECT t.target, t.state, t.delivered_epoch, count(b.epoch) FROM twophase_targets t"
        " LEFT JOIN twophase_target_backlog b ON b.sink_id = t.sink_id AND b.target = t.target"
        " WHERE t.sink_id = %s GROUP BY t.target, t.state, t.delivered_epoch",
        SINK,
    )
    keys = ("target", "state", "delivered_epoch", "lag_epochs")
    return {row[0]: dict(zip(keys, row, strict=True)) for row in rows}


def cursor(fan: Fan, target: str) -> int:
    """The last epoch of the stats sink delivered to a target in epoch order."""
    rows = query(
        fan.target.staging_url,
        "SELECT COALESCE(delivered_epoch, -1) FROM twophase_targets"
        " WHERE sink_id = %s AND target = %s",
        SINK,
        target,
    )
    return int(rows[0][0])


def backlog(fan: Fan, target: str) -> list[int]:
    """The COMMITTED epochs of the stats sink that a target is owed and lacks."""
    rows = query(
        fan.target.staging_url,
        "SELECT epoch FROM twophase_target_backlog WHERE sink_id = %s AND target = %s"
        " ORDER BY epoch",
        SINK,
        target,
    )
    return [int(row[0]) for row in rows]


def recover(fan: Fan) -> list[tuple[str, str, int]]:
    """``twophase recover --sink dash --force``: what the killed driver left pending, then
    every lagging target's backlog; (sink, target, epoch) of each catch-up delivery."""
    done = cli_run(fan, "recover", "--sink", SINK, "--force", "--json")
    assert done.code == 0, done.err
    return [(c["sink_id"], c["target"], c["epoch"]) for c in done.json()["caught_up"]]


def cli_run(fan: Fan, *args: str) -> Any:
    """The installed ``twophase`` in a subprocess, configured like the job (the targets)."""
    cli = make_cli(fan.target.staging_url, fan.target.influx)
    return cli.run(*args, env=fan.target.env())


def all_targets_exact(fan: Fan, files: Sequence[Path]) -> None:
    """Each target holds exactly the aggregates; each target's cursor is on the last
    COMMITTED epoch, reached in epoch order; VictoriaMetrics, which keeps duplicates,
    got each epoch once but for the promotions a kill cut (re-sent whole)."""
    url = fan.target.staging_url
    assert not mismatches(fan.target.influx, files)
    assert not mismatches(fan.b, files)
    assert not vm_mismatches(fan, files)
    rows = epochs(url, SINK)
    assert {row["state"] for row in rows} == {"COMMITTED"}, rows
    last = max(row["epoch"] for row in rows)
    cursors = query(
        url, "SELECT target, state, delivered_epoch FROM twophase_targets WHERE sink_id = %s", SINK
    )
    assert {t: (s, d) for t, s, d in cursors} == {n: ("live", last) for n in NAMES}, cursors
    for name in NAMES:
        order = delivered_epochs(url, name)
        assert order == sorted(order) and len(set(order)) == len(order), (name, order)
    cut_resent = sum(row["points"] * (row["promote_attempts"] - 1) for row in rows)
    sent = sum(delivered_points(url, "vm"))
    assert sent <= vm_samples(fan) <= sent + cut_resent, (vm_samples(fan), sent, cut_resent)


def b_got_each_epoch_once(fan: Fan, had: int) -> list[int]:
    """Since its return b was sent the points of the epochs past its cursor then, once
    each, but for the one epoch the job's catch-up was sending when it was killed
    (recover sends it again, whole). Returns those epochs."""
    points = {row["epoch"]: row["points"] for row in epochs(fan.target.staging_url, SINK)}
    owed = [epoch for epoch in sorted(points) if epoch > had]
    want = sum(points[epoch] for epoch in owed)
    cut = max(points[epoch] for epoch in owed)
    assert want <= fan.proxy.lines <= want + cut, (fan.proxy.lines, want, cut)
    return owed


def delivered_epochs(url: str, target: str) -> list[int]:
    """The stats sink's epochs recorded as delivered to a target, in recording order."""
    rows = query(
        url,
        "SELECT epoch FROM twophase_target_deliveries WHERE sink_id = %s AND target = %s"
        " ORDER BY at, epoch",
        SINK,
        target,
    )
    return [int(row[0]) for row in rows]


def delivered_points(url: str, target: str) -> list[int]:
    rows = query(
        url,
        "SELECT delivered FROM twophase_target_deliveries WHERE sink_id = %s AND target = %s",
        SINK,
        target,
    )
    return [int(row[0]) for row in rows]


# --- VictoriaMetrics ----------------------------------------------------------------------


def vm_series(fan: Fan, fields: Sequence[str] = EXACT_FIELDS) -> list[dict[str, Any]]:
    """This test's raw samples of ``stream_stats_<field>`` (VM names a field's series so)."""
    pool = urllib3.PoolManager(retries=False, timeout=10)
    pool.request("GET", f"{fan.vm_url}/internal/force_flush")  # readable at once
    names = "|".join(fields)
    match = f'{{__name__=~"{MEASUREMENT}_({names})",db="{fan.vm_db}"}}'
    body = pool.request("GET", f"{fan.vm_url}/api/v1/export?{urlencode({'match[]': match})}")
    return [json.loads(line) for line in body.data.decode().splitlines() if line.strip()]


def vm_stats(fan: Fan) -> dict[Key, dict[str, int]]:
    """Key -> fields. A window has a sample per epoch that updated it (VM overwrites
    nothing); its aggregates only grow from one update to the next, so its value is the
    largest."""
    stats: dict[Key, dict[str, int]] = {}
    for series in vm_series(fan):
        labels = series["metric"]
        field = labels["__name__"].removeprefix(MEASUREMENT + "_")
        for value, ms in zip(series["values"], series["timestamps"], strict=True):
            fields = stats.setdefault((ms // 1000, labels["stream_id"], labels["isp"]), {})
            fields[field] = max(int(value), fields.get(field, 0))
    return stats


def vm_mismatches(fan: Fan, files: Sequence[Path]) -> list[str]:
    want, got = expected_stats(files), vm_stats(fan)
    return [
        f"{key}: VictoriaMetrics {got.get(key)}, expected {want.get(key)}"
        for key in sorted(set(want) | set(got))
        if got.get(key) != want.get(key)
    ]


def vm_samples(fan: Fan) -> int:
    """How many points VictoriaMetrics received: every point has an ``events`` field."""
    return sum(len(s["values"]) for s in vm_series(fan, ("events",)))
