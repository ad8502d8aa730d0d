"""The parts ``python -m bench.fanout`` measures with: the InfluxDB servers, each
setting's databases and proxies (20 ms away, or loopback), and the sinks."""

from __future__ import annotations

import dataclasses
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.cpu import influxd_pid
from bench.fanout_cpu import Meter
from bench.lines import Seeds, epoch_lines
from bench.proxies import ProxyProcess
from bench.servers import Scratch
from bench.sides import QUERY_ID, BenchError
from devkit.faultproxy import CUT, PASS
from devkit.ports import start_own_influx
from twophase.config import InfluxDBSettings, NamedTarget, TargetConfig
from twophase.influx.query import query_v1
from twophase.model import EpochState, Lease
from twophase.protocol.commit.runtime import TwoPhase

# While b is down, the catch-up worker of the committing process retries it in the
# background, holding b's lock (a PostgreSQL advisory lock) for a whole round. With
# the default round (target_retry_deadline, 300 s) it would still hold the lock
# when the bench closes that process and catches b up from another one; a round
# of 1 s lets it go at once. The commits give up on b after target_deadline either way.
DOWN_ROUND_S = 1.0


@dataclass(frozen=True)
class Addresses:
    """One setting's InfluxDB databases as its sinks reach them (through a proxy each, or
    straight): ``one`` (the one-target sink's), ``two_a`` and ``two_b`` (the two-target
    sink's), ``down_a`` and ``down_b`` (the sink whose b goes down); ``cut``, b's address
    while it is down. A sink of its own per database: b's backlog then lands after
    the epochs b already holds, as it would, not into the past of another sink's."""

    dbs: dict[str, TargetConfig]
    cut: str
    proxy_pids: tuple[int, ...]

    def single(self) -> TargetConfig:
        return self.dbs["one"]

    def fan(self) -> TargetConfig:
        return _targets(self.dbs["two_a"], self.dbs["two_b"])

    def outage(self) -> TargetConfig:
        down = dataclasses.replace(
            self.dbs["down_b"], url=self.cut, retry_deadline_s=DOWN_ROUND_S, retry_max_s=0.5
        )
        return _targets(self.dbs["down_a"], down)

    def back(self) -> TargetConfig:
        """The outage's sink once b is back (its address its own again)."""
        return _targets(self.dbs["down_a"], self.dbs["down_b"])


def _targets(a: TargetConfig, b: TargetConfig) -> TargetConfig:
    return dataclasses.replace(a, targets=(NamedTarget("a", a), NamedTarget("b", b)))


def create_database(url: str, name: str) -> TargetConfig:
    query_v1(url, None, f'CREATE DATABASE "{name}"', method="POST")
    return TargetConfig(url=url, influxdb=InfluxDBSettings(api="v1", database=name))


MakeDb = Callable[[str, str], TargetConfig]  # (server URL, name): a new database there
# database -> (server: 0 is a's, 1 is b's; route: whose proxy)
_DATABASES = {
    "one": (0, "one"),
    "two_a": (0, "a"),
    "two_b": (1, "b"),
    "down_a": (0, "a"),
    "down_b": (1, "b"),
}


@contextmanager
def addresses(servers: tuple[str, str], make: MakeDb, delay_s: float) -> Iterator[Addresses]:
    """The setting's databases on ``servers`` (a's and the one-target sink's, b's). With
    ``delay_s``, each target (the one target too) behind a proxy of its own holding
    every answer that long, as a server far away; without, straight (loopback). b,
    down: a proxy in ``cut`` mode, in either case."""
    with ExitStack() as stack:
        pids: list[int] = []

        def proxy(url: str, mode: str = PASS) -> str:
            made = stack.enter_context(ProxyProcess(url, delay_s, mode))
            pids.append(made.pid)
            return made.url

        cut = proxy(servers[1], CUT)
        routes = {"one": servers[0], "a": servers[0], "b": servers[1]}
        if delay_s:
            routes = {name: proxy(url) for name, url in routes.items()}
        dbs = {
            name: dataclasses.replace(make(servers[server], name), url=routes[route])
            for name, (server, route) in _DATABASES.items()
        }
        yield Addresses(dbs, cut, tuple(pids))


@dataclass(frozen=True)
class Influxes:
    """The run's InfluxDB servers (a's and the one-target sink's, b's), how a database is
    made on one, and the influxd processes whose CPU is counted."""

    urls: tuple[str, str]
    make: MakeDb
    pids: tuple[int, ...]


@contextmanager
def influx_servers(made: Scratch, dev_server: bool) -> Iterator[Influxes]:
    """Two influxd of the run's own, in temporary folders on the dev server's disk, with
    its configuration (``tests.support.start_own_influx``); or, ``dev_server``, the dev
    InfluxDB alone (two databases for the two targets)."""
    if dev_server:
        dev, url = influxd_pid(), made.servers.influx_url
        yield Influxes((url, url), lambda _, name: made.influx(name), (dev,) if dev else ())
        return
    with ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"{made.prefix}_")))
        servers = []
        for name in ("first", "second"):
            servers.append(start_own_influx(root / name, "bench"))
            stack.callback(servers[-1].stop)  # stopped even if the second does not start
        yield Influxes(
            (servers[0].url, servers[1].url),
            lambda url, name: create_database(url, f"{made.prefix}_{name}"),
            tuple(pid for pid in (s.pid() for s in servers) if pid),
        )


def points_in(config: TargetConfig) -> int:
    """The points in the configuration's database (one field every point has)."""
    assert config.influxdb.database is not None
    series = query_v1(
        config.url, config.influxdb.database, "SELECT count(bytes_cdn) FROM stream_stats"
    )
    return int(series[0]["values"][0][1]) if series else 0


class Sink:
    """One sink of the bench, over the parts given to ``attach``: each epoch staged off
    the clock, then committed on it (its CPU metered by ``meter``, under ``name``)."""

    def __init__(self, name: str, sink_id: str, seeds: Seeds, points: int, meter: Meter) -> None:
        self.name, self.sink_id, self.seeds, self.points = name, sink_id, seeds, points
        self.meter = meter
        self.epoch = 0  # the next epoch; also the epochs committed so far
        self._tp: TwoPhase | None = None
        self._lease: Lease | None = None

    @property
    def lease(self) -> Lease:
        assert self._lease is not None, "attach first"
        return self._lease

    def attach(self, tp: TwoPhase) -> None:
        """Claim the sink for a new run through ``tp``, as a driver starts."""
        self._tp = tp
        self._lease = tp.claim(self.sink_id, uuid.uuid4().hex, QUERY_ID)

    def commit(self, label: str | None = None) -> float:
        """Stage a fresh epoch, then commit it (decide, promote, mark); its seconds.
        ``label``: the meter's name for it (default: the sink's)."""
        assert self._tp is not None, "attach first"
        lines = epoch_lines(self.points, self.seeds.take())
        message = self._tp.stager.stage(self.sink_id, self.epoch, lines)
        with self.meter.measure(label or self.name):
            start = time.perf_counter()
            outcome = self._tp.committer.commit(self.lease, self.epoch, [message])
            elapsed = time.perf_counter() - start
        if outcome.state != EpochState.COMMITTED:
            raise BenchError(f"{self.sink_id} epoch {self.epoch}: {outcome.state}")
        self.epoch += 1
        return elapsed
