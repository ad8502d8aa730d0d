"""A real Prometheus scraping the exporter through an InfluxDB outage.

A workload commits one epoch of a sink every few hundred milliseconds into a
private InfluxDB; the test stops that InfluxDB, so the epoch being promoted
stays PRECOMMITTED, starts it again, and reads the story back from
Prometheus's HTTP API: the last committed epoch climbs, the oldest
PRECOMMITTED epoch's age grows during the outage and falls back to 0 after
recovery.

With ``TWOPHASE_PLOT_DIR`` set, the scraped series are drawn into
``$TWOPHASE_PLOT_DIR/prometheus-outage.png``.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from devkit import InfluxServer, PrometheusServer, ServiceError
from devkit.ports import free_port
from tests.staging import lines, stage
from tests.support import OWN_INFLUX_DB, begin_run, two_phase
from twophase.config import ExporterConfig, InfluxDBSettings, StagingConfig, TargetConfig
from twophase.errors import TargetUnavailableError
from twophase.operations import exporter
from twophase.protocol.commit.runtime import TwoPhase
from twophase.store.database import Database

pytestmark = pytest.mark.integration

SINK = "prom"
SEL = f'{{sink="{SINK}"}}'
COMMITTED = f"twophase_last_committed_epoch{SEL}"
AGE = f"twophase_oldest_precommitted_age_seconds{SEL}"
PRECOMMITTED_EPOCHS = f'twophase_epochs{{sink="{SINK}",state="precommitted"}}'
POINTS_PER_EPOCH = 20
EPOCH_EVERY_S = 0.5
DEADLINE_S = 25.0  # per wait; the whole test takes about half a minute
PLOT_FILE = "prometheus-outage.png"


@dataclass
class Workload:
    """Commits epochs 0, 1, ... of ``SINK`` until stopped, like a Spark driver would.

    When a commit fails (InfluxDB down past the retry deadline), the epoch is
    decided but stays PRECOMMITTED; the workload then calls ``recover`` until
    it is promoted, and goes on with the next epoch.
    """

    tp: TwoPhase
    stop: threading.Event = field(default_factory=threading.Event)
    last_committed: int = -1
    failures: int = 0
    error: BaseException | None = None

    def run(self) -> None:
        try:
            lease = begin_run(self.tp, SINK, "r1", "q1")
            epoch = 0
            while not self.stop.is_set():
                messages = stage(self.tp, SINK, epoch, [lines(epoch, POINTS_PER_EPOCH)])
                try:
                    self.tp.committer.commit(lease, epoch, messages)
                except TargetUnavailableError:
                    self.failures += 1
                    assert self.tp.ledger.pending(SINK) == [epoch]  # decided, not promoted
                    if not self._recover(lease):
                        return  # stopped (the test failed) before InfluxDB came back
                self.last_committed = epoch
                epoch += 1
                self.stop.wait(EPOCH_EVERY_S)
        except BaseException as exc:  # reported by the test thread
            self.error = exc

    def _recover(self, lease: Any) -> bool:
        """True once the pending epoch is promoted; False when stopped before that."""
        # No sleep needed: each attempt lasts the retry deadline while InfluxDB is down.
        while not self.stop.is_set():
            try:
                self.tp.committer.recover(lease)
                return True
            except TargetUnavailableError:
                self.failures += 1
        return False


def value(result: list[dict[str, Any]]) -> float | None:
    """The single sample of an instant query's vector, None when it has none."""
    if not result:
        return None
    assert len(result) == 1, result
    return float(result[0]["value"][1])


class Scraped:
    """Polls Prometheus with a deadline; failures carry the logs for diagnosis."""

    def __init__(self, prom: PrometheusServer, workload: Workload) -> None:
        self.prom = prom
        self.workload = workload

    def get(self, expr: str) -> float | None:
        return value(self.prom.query(expr))

    def wait(self, expr: str, accept: Callable[[float], bool], what: str) -> float:
        deadline = time.monotonic() + DEADLINE_S
        seen: float | None = None
        while time.monotonic() < deadline:
            if self.workload.error is not None:
                raise AssertionError("the workload failed") from self.workload.error
            seen = self.get(expr)
            if seen is not None and accept(seen):
                return seen
            time.sleep(0.2)
        log = self.prom.log_file.read_text(errors="replace").splitlines()[-30:]
        raise AssertionError(
            f"{what}: {expr} = {seen} after {DEADLINE_S}s; up = {self.prom.query('up')}\n"
            f"prometheus log {self.prom.log_file}:\n" + "\n".join(log)
        )


@pytest.fixture
def metrics_port(staging: StagingConfig) -> Iterator[int]:
    served = exporter.start(
        Database(staging), port=free_port(), live_window_s=600, config=ExporterConfig(cache_s=0)
    )
    yield served.port
    served.close()


@pytest.fixture
def prometheus(tmp_path: Path, metrics_port: int) -> Iterator[PrometheusServer]:
    for attempt in range(3):  # another process may grab the free port before Prometheus binds
        server = PrometheusServer(
            tmp_path / f"prometheus-{attempt}",
            free_port(),
            scrape_targets=[f"127.0.0.1:{metrics_port}"],
            scrape_interval_s=1.0,
        )
        try:
            server.start()
            break
        except ServiceError:
            server.kill()
    else:
        raise RuntimeError("prometheus did not start on three free ports")
    yield server
    server.stop()


def test_prometheus_sees_an_influx_outage_and_its_recovery(
    staging: StagingConfig, own_influx: InfluxServer, prometheus: PrometheusServer
) -> None:
    influx = TargetConfig(
        url=own_influx.url,
        retry_deadline_s=2,
        retry_initial_s=0.05,
        retry_max_s=0.5,
        influxdb=InfluxDBSettings(api="v1", database=OWN_INFLUX_DB),
    )
    outage: tuple[float, float] | None = None
    with two_phase(staging, influx) as tp:
        workload = Workload(tp)
        thread = threading.Thread(target=workload.run, name="workload", daemon=True)
        scraped = Scraped(prometheus, workload)
        # (d) Prometheus 2.x applies its targets on a 5 s tick: the first scrape takes a
        # while, and the workload waits for it so that Prometheus sees the epochs climb.
        assert scraped.wait("twophase_store_up", lambda v: v == 1, "store up") == 1
        started = time.time()
        thread.start()
        try:
            # (a) the last committed epoch climbs as epochs commit.
            first = scraped.wait(COMMITTED, lambda v: v >= 3, "epochs committed")
            scraped.wait(COMMITTED, lambda v: v >= first + 6, "more epochs committed")
            assert workload.failures == 0

            # (b) InfluxDB down: the epoch being promoted stays PRECOMMITTED and ages.
            down_at = time.time()
            own_influx.stop()
            assert scraped.wait(PRECOMMITTED_EPOCHS, lambda v: v > 0, "an epoch precommitted") == 1
            a1 = scraped.wait(AGE, lambda v: v > 0, "age above 0")
            a2 = scraped.wait(AGE, lambda v: v > a1, "age growing")
            scraped.wait(AGE, lambda v: v >= 6, "age of a few seconds")  # a visible outage
            stuck = scraped.get(COMMITTED)
            assert stuck is not None
            assert stuck == workload.last_committed  # nothing committed past the outage
            assert workload.failures >= 1

            # (c) InfluxDB back: recovery promotes the epoch, the age falls back to 0.
            own_influx.start()
            outage = (down_at, time.time())
            scraped.wait(COMMITTED, lambda v: v >= stuck + 6, "epochs committed after recovery")
        finally:
            workload.stop.set()
            thread.join(timeout=30)
        assert not thread.is_alive()
        assert outage is not None
        if workload.error is not None:
            raise workload.error
        last = workload.last_committed
        assert scraped.wait(COMMITTED, lambda v: v == last, "last epoch committed") == last
        assert scraped.wait(AGE, lambda v: v == 0, "age back to 0") == 0
        assert scraped.wait(PRECOMMITTED_EPOCHS, lambda v: v == 0, "nothing precommitted") == 0
        assert scraped.wait("twophase_store_up", lambda v: v == 1, "store up") == 1  # (d)
        peak = scraped.get(f"max_over_time({AGE}[5m])")
        assert peak is not None and peak >= 6
        retries = scraped.get(f"twophase_promote_retries_total{SEL}")
        assert retries is not None and retries >= 1
        delivered = scraped.get(f"twophase_points_delivered_total{SEL}")
        assert delivered == (last + 1) * POINTS_PER_EPOCH
        print(
            f"\nlast epoch {last}, outage {outage[1] - outage[0]:.1f}s, failed attempts "
            f"{workload.failures}, age readings {a1:.2f} < {a2:.2f}, max age {peak:.2f}s, "
            f"promote retries {retries:.0f}, points delivered {delivered:.0f}, "
            f"test {time.time() - started:.1f}s"
        )
    plot_dir = os.environ.get("TWOPHASE_PLOT_DIR")
    if plot_dir:
        plot(prometheus, Path(plot_dir) / PLOT_FILE, started, time.time(), outage)


def plot(
    prom: PrometheusServer,
    path: Path,
    start: float,
    end: float,
    outage: tuple[float, float],
) -> None:
    """Draws the scraped series: epochs on top (and the delivery rate), the age below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Steps aligned on the end, so that the last one shows the final values.
    first_step = end - math.ceil(end - start)

    def series(expr: str) -> tuple[list[float], list[float]]:
        result = prom.query_range(expr, first_step, end, step_s=1.0)
        if not result:
            return [], []
        samples = result[0]["values"]
        return [float(t) - start for t, _ in samples], [float(v) for _, v in samples]

    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 6), constrained_layout=True)
    for ax in (top, bottom):
        down = (outage[0] - start, outage[1] - start)
        ax.axvspan(*down, color="tab:red", alpha=0.12, label="InfluxDB down")
        ax.grid(alpha=0.3)
    top.step(*series(f"twophase_last_decided_epoch{SEL}"), where="post", label="last decided")
    top.step(*series(COMMITTED), where="post", label="last committed")
    top.set_ylabel("epoch")
    rate = top.twinx()
    rate.plot(
        *series(f"rate(twophase_points_delivered_total{SEL}[5s])"),
        color="tab:green",
        alpha=0.6,
        linestyle="--",
        label="points delivered / s",
    )
    rate.set_ylabel("points / s (5s rate)")
    handles = top.get_legend_handles_labels()[0] + rate.get_legend_handles_labels()[0]
    top.legend(handles=handles, loc="upper left")
    top.set_title("Scraped by Prometheus through an InfluxDB outage (shaded)")
    bottom.plot(
        *series(AGE),
        color="tab:red",
        marker=".",
        label="oldest PRECOMMITTED epoch's age",
    )
    bottom.legend(loc="upper left")
    bottom.set_ylabel("oldest PRECOMMITTED age (s)")
    bottom.set_xlabel("seconds since the workload started")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
