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

from devkit.faultproxy import FaultProxy
from tests.integration.cli_helpers import sql
from tests.staging import M, lines
from tests.support import (
    admin_conninfo,
    create_influx_database,
    drop_influx_database,
    influx_count,
    influx_query,
    unique,
)
from twophase.config import InfluxConfig, TargetConfig
from twophase.influx.api import make_writer


@dataclass(frozen=True)
class Pair:
    """Targets ``a`` (direct) and ``b`` (through ``proxy``), and the sink's config."""

    a: InfluxConfig
    b: InfluxConfig
    b_direct: InfluxConfig  # b's database without the proxy (for reading it)
    proxy: FaultProxy
    config: InfluxConfig


@contextmanager
def two_targets(influx_url: str, **settings: Any) -> Iterator[Pair]:
    """Databases on the test server for targets a and b, b behind a fault proxy;
    ``settings``: InfluxConfig fields (``min_targets``, ``target_deadline_s``...)."""
    names = unique("tpa"), unique("tpb")
    for name in names:
        create_influx_database(influx_url, name)
    proxy = FaultProxy.for_url(influx_url).start()
    # a target's own retry deadline is the sink's unless the test sets one for both
    deadline = settings.get("retry_deadline_s", 20)
    shared = dict(api="v1", retry_deadline_s=deadline, retry_initial_s=0.05, retry_max_s=0.5)
    a = InfluxConfig(url=influx_url, database=names[0], **shared)  # type: ignore[arg-type]
    b_direct = InfluxConfig(url=influx_url, database=names[1], **shared)  # type: ignore[arg-type]
    b = dataclasses.replace(b_direct, url=proxy.url)
    config = dataclasses.replace(
        a,
        targets=(TargetConfig("a", a), TargetConfig("b", b)),
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


def expect(target: InfluxConfig, epochs: list[int]) -> None:
    """The target holds exactly these epochs' points, the last one's value last."""
    assert influx_count(target, M) == N * len(epochs) + 1
    series = influx_query(target, "SELECT v FROM proto WHERE host = 'last'")
    assert series[0]["values"][0][1] == max(epochs)


def write_points(influx: InfluxConfig, lines_: list[str]) -> None:
    writer = make_writer(influx)
    try:
        writer.write("\n".join(lines_).encode())
    finally:
        writer.close()


def dead_letter_targets(url: str) -> dict[str, int]:
    rows = sql(url, "SELECT target, count(*) FROM twophase_dead_letters GROUP BY target")
    return {target: count for target, count in rows}
