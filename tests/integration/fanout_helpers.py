"""Two InfluxDB targets for a sink, on the real InfluxDB: two databases, the second
reached through a fault proxy so that a test can take it down; and the points the
two-target tests commit and check."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg

from devkit.faultproxy import CUT, PASS, FaultProxy
from tests.integration.cli_helpers import sql
from tests.staging import M, lines
from tests.support import (
    admin_conninfo,
    changed,
    create_influx_database,
    drop_influx_database,
    influx_count,
    influx_query,
    target_config,
    two_phase,
    unique,
)
from twophase.config import NamedTarget, StagingConfig, TargetConfig
from twophase.influx.api import make_writer
from twophase.model import Lease
from twophase.protocol.commit.runtime import TwoPhase


@dataclass(frozen=True)
class Pair:
    """Targets ``a`` (direct) and ``b`` (through ``proxy``), and the sink's config."""

    a: TargetConfig
    b: TargetConfig
    b_direct: TargetConfig  # b's database without the proxy (for reading it)
    proxy: FaultProxy
    config: TargetConfig


@contextmanager
def two_targets(influx_url: str, **settings: Any) -> Iterator[Pair]:
    """Databases on the test server for targets a and b, b behind a fault proxy;
    ``settings``: TargetConfig fields (``min_targets``, ``target_deadline_s``...)."""
    names = unique("tpa"), unique("tpb")
    for name in names:
        create_influx_database(influx_url, name)
    proxy = FaultProxy.for_url(influx_url).start()
    # a target's own retry deadline is the sink's unless the test sets one for both
    deadline = settings.get("retry_deadline_s", 20)
    shared = dict(api="v1", retry_deadline_s=deadline, retry_initial_s=0.05, retry_max_s=0.5)
    a = target_config(influx_url, **shared, database=names[0])
    b_direct = target_config(influx_url, **shared, database=names[1])
    b = dataclasses.replace(b_direct, url=proxy.url)
    config = changed(
        a,
        targets=(NamedTarget("a", a), NamedTarget("b", b)),
        **{"target_deadline_s": 1.0, **settings},
    )
    try:
        yield Pair(a, b, b_direct, proxy, config)
    finally:
        proxy.stop()
        for name in names:
            drop_influx_database(influx_url, name)


def target_rows(url: str, sink: str) -> dict[str, dict[str, Any]]:
    """The sink's targets as stored: name -> state, delivered_epoch, from_epoch."""
    with psycopg.connect(admin_conninfo(url)) as conn:
        rows = conn.execute(
            "SELECT target, state, delivered_epoch, from_epoch FROM twophase_targets"
            " WHERE sink_id = %s",
            (sink,),
        ).fetchall()
    return {t: {"state": s, "delivered": d, "from": f} for t, s, d, f in rows}


def deliveries(url: str, sink: str, target: str) -> list[int]:
    """The epochs recorded as delivered to a target, in the order they were recorded."""
    with psycopg.connect(admin_conninfo(url)) as conn:
        rows = conn.execute(
            "SELECT epoch FROM twophase_target_deliveries WHERE sink_id = %s AND target = %s"
            " ORDER BY at, epoch",
            (sink, target),
        ).fetchall()
    return [r[0] for r in rows]


N = 20  # points per epoch, besides the one point every epoch rewrites


def points(epoch: int) -> list[str]:
    """N points of the epoch's own, and one point (series ``host=last``) every epoch
    writes with its number: a target ends with the highest epoch's value only if it
    got the epochs in order."""
    return [*lines(epoch, N), f"{M},host=last v={epoch} 1700000000000000000"]


def expect(target: TargetConfig, epochs: list[int]) -> None:
    """The target holds exactly these epochs' points, the last one's value last."""
    assert influx_count(target, M) == N * len(epochs) + 1
    series = influx_query(target, "SELECT v FROM proto WHERE host = 'last'")
    assert series[0]["values"][0][1] == max(epochs)


def write_points(influx: TargetConfig, lines_: list[str]) -> None:
    writer = make_writer(influx)
    try:
        writer.write("\n".join(lines_).encode())
    finally:
        writer.close()


def dead_letter_targets(url: str) -> dict[str, int]:
    rows = sql(url, "SELECT target, count(*) FROM twophase_dead_letters GROUP BY target")
    return {target: count for target, count in rows}


@dataclass(frozen=True)
class Targets:
    """Targets a and b, each behind its proxy; ``direct``: each database without it."""

    config: TargetConfig
    proxies: dict[str, FaultProxy]
    direct: dict[str, TargetConfig]

    def down(self, *names: str) -> None:
        for name in names:
            self.proxies[name].set_mode(CUT)

    def up(self, *names: str) -> None:
        for name in names:
            self.proxies[name].set_mode(PASS)

    def with_targets(self, *names: str, **settings: Any) -> TargetConfig:
        """The sink's configuration naming only ``names`` (others removed from it)."""
        chosen = tuple(t for t in self.config.targets if t.name in names)
        return changed(self.config, targets=chosen, **settings)


@contextmanager
def proxied_targets(
    influx_url: str, names: tuple[str, ...] = ("a", "b"), **settings: Any
) -> Iterator[Targets]:
    databases = {name: unique(f"tp{name}") for name in names}
    for database in databases.values():
        create_influx_database(influx_url, database)
    proxies = {name: FaultProxy.for_url(influx_url).start() for name in names}
    shared = dict(api="v1", retry_deadline_s=4, retry_initial_s=0.05, retry_max_s=0.3)
    direct = {
        name: target_config(influx_url, **shared, database=db) for name, db in databases.items()
    }
    targets = tuple(
        NamedTarget(name, dataclasses.replace(direct[name], url=proxies[name].url))
        for name in names
    )
    config = changed(direct[names[0]], targets=targets, **{"target_deadline_s": 1.0, **settings})
    try:
        yield Targets(config, proxies, direct)
    finally:
        for proxy in proxies.values():
            proxy.stop()
        for database in databases.values():
            drop_influx_database(influx_url, database)


@contextmanager
def without_worker(
    staging: StagingConfig, config: TargetConfig, sink: str
) -> Iterator[tuple[TwoPhase, Lease]]:
    """The sink claimed with no catch-up worker: a lagging target stays behind until
    the test, or the availability rule, delivers its backlog."""
    with two_phase(staging, config) as tp:
        lease = tp.committer.claim(sink, "r1", "q1")
        tp.catch_up.close()
        yield tp, lease
