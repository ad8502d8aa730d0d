"""Metric 10: promotion to an InfluxDB 20 ms away, on a fast and on a slow link.

Every request to InfluxDB goes through the test kit's proxy
(``devkit/faultproxy.py``) in a child process of its own
(:class:`bench.proxies.ProxyProcess`, so that relaying does not take the
bench's interpreter lock), over one of two links:

- ``20 ms``: each answer held 20 ms, bandwidth unlimited (loopback's): a
  round trip as to a server in another region;
- ``20 ms, 100 Mbit/s``: the same, and each direction limited to 100 Mbit/s,
  shared by all the link's connections (a token bucket): a link whose
  capacity, not its round trip, bounds a large write.

The proxy models neither TCP's window nor slow start (``tc netem`` in a
network namespace would, but this machine's kernel has no netem qdisc).
PostgreSQL stays local, as it would beside the Spark driver.

The same epochs (``roundtrip`` in :mod:`bench.plan`) go back to back through
every side, each side into an InfluxDB database of its own, after a small
warm-up epoch each; the sides' order rotates per repeat; points per second
over the whole run, medians. The twophase sides run the core protocol as a
sink does (stage, then commit: recover, decide, promote, mark; a background
side's final drain inside the timing):

- ``twophase``: the defaults, ``promote_connections = 4``, ``compression =
  gzip`` (chunks staged as gzip members, sent as stored);
- ``twophase none``: the same with ``compression = none`` (reported);
- ``twophase 1 lane`` (fast link): ``promote_connections = 1``;
- ``twophase background`` (slow link): ``promotion = background``, staging
  epoch N+1 while N travels (reported).

The direct sides are what a user writes instead (:mod:`bench.direct`, none
of twophase's code): the lines cut into four parts POSTed at once over four
connections, as four partitions do (``direct x4``); on the slow link also
with each request ``gzip.compress``-ed, at level 1 (``direct x4 gzip level
1``: on two cores the strongest writer a user could write, its compression
15 times cheaper than level 9's for 1.3 times the bytes) and at the
function's default level 9, which influxdb-client's ``enable_gzip`` uses too
(``direct x4 gzip``, reported).

Targets: on the fast link, twophase >= 0.9x direct x4 and >= 3x twophase 1
lane; on the slow link, twophase >= 0.9x direct x4 gzip level 1 and >= 2x
direct x4 (uncompressed).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from bench.background import Consecutive, rates
from bench.context import MAIN, Context
from bench.direct import USERS_GZIP_LEVEL
from bench.lines import epoch_lines
from bench.proxies import ProxyProcess
from bench.report import size_label
from bench.sides import DirectSide
from bench.stats import compared, rotated
from twophase.config import BACKGROUND, GZIP, INLINE, UNCOMPRESSED, TwoPhaseConfig
from twophase.protocol.commit.runtime import TwoPhase

ROUND_TRIP_S = 0.020
SLOW_LINK_BPS = 100_000_000
LANES = 4
TO_DIRECT, TO_PLAIN_DIRECT, TO_ONE_LANE = 0.9, 2.0, 3.0
WARM_UP_POINTS = 10_000  # per side, before the timing: databases, shards, connections


@dataclass(frozen=True)
class Link:
    """The proxy's link: every answer held ``ROUND_TRIP_S``; ``bandwidth_bps`` each way."""

    name: str
    bandwidth_bps: float | None


@dataclass(frozen=True)
class Protocol:
    """How a twophase side is configured."""

    lanes: int = LANES
    promotion: str = INLINE
    compression: str = GZIP


FAST = Link("20 ms", None)
SLOW = Link("20 ms, 100 Mbit/s", SLOW_LINK_BPS)
DIRECT = f"direct x{LANES}"
DIRECT_GZIP = f"{DIRECT} gzip"
DIRECT_GZIP_1 = f"{DIRECT} gzip level 1"
TWOPHASE_SIDES: dict[Link, dict[str, Protocol]] = {
    FAST: {
        "twophase": Protocol(),
        "twophase none": Protocol(compression=UNCOMPRESSED),
        "twophase 1 lane": Protocol(lanes=1),
    },
    SLOW: {
        "twophase": Protocol(),
        "twophase none": Protocol(compression=UNCOMPRESSED),
        "twophase background": Protocol(promotion=BACKGROUND),
    },
}
# side -> the gzip level of its request bodies (None: text); LANES connections each
DIRECT_SIDES: dict[Link, dict[str, int | None]] = {
    FAST: {DIRECT: None},
    SLOW: {DIRECT: None, DIRECT_GZIP: USERS_GZIP_LEVEL, DIRECT_GZIP_1: 1},
}
# (link, side, other side, target or None: reported)
ROWS: tuple[tuple[Link, str, str, float | None], ...] = (
    (FAST, "twophase", DIRECT, TO_DIRECT),
    (FAST, "twophase", "twophase 1 lane", TO_ONE_LANE),
    (FAST, "twophase none", DIRECT, None),
    (SLOW, "twophase", DIRECT_GZIP_1, TO_DIRECT),
    (SLOW, "twophase", DIRECT_GZIP, None),
    (SLOW, "twophase", DIRECT, TO_PLAIN_DIRECT),
    (SLOW, "twophase none", DIRECT, None),
    (SLOW, "twophase background", DIRECT_GZIP_1, None),
)

Run = Callable[[Sequence[Sequence[str]]], float]  # epochs -> wall seconds


def measure_roundtrip(ctx: Context) -> dict[str, Any]:
    size, count, repeats = ctx.plan.roundtrip
    with ExitStack() as stack:
        runs: dict[str, Run] = {}
        for link in (FAST, SLOW):
            influx_url = ctx.scratch.servers.influx_url
            proxy = ProxyProcess(influx_url, ROUND_TRIP_S, bandwidth_bps=link.bandwidth_bps)
            url = stack.enter_context(proxy).url
            runs |= _twophase_runs(ctx, stack, link, url)
            runs |= _direct_runs(ctx, stack, link, url)
        _warm_up(ctx, runs)
        ctx.log(f"roundtrip: {count} x {size:,}-point epochs x {repeats}, {len(runs)} sides")
        rate = rates(ctx, size, count)
        got = rotated(repeats, {name: rate(run) for name, run in runs.items()})
    return _result(got, size, count)


def _twophase_runs(ctx: Context, stack: ExitStack, link: Link, url: str) -> dict[str, Run]:
    runs: dict[str, Run] = {}
    for side, how in TWOPHASE_SIDES[link].items():
        name = _name(link, side)
        tp = _open(ctx, _slug(name), url, how)
        stack.callback(tp.close)
        runs[name] = Consecutive(tp, "bench-" + _slug(name).replace("_", "-")).run
    return runs


def _open(ctx: Context, role: str, url: str, how: Protocol) -> TwoPhase:
    config = ctx.scratch.config(MAIN, role)
    staging = dataclasses.replace(config.staging, lanes=how.lanes, compression=how.compression)
    influx = dataclasses.replace(config.target, url=url, promotion=how.promotion)
    return TwoPhase.open(TwoPhaseConfig(staging, influx))


def _direct_runs(ctx: Context, stack: ExitStack, link: Link, url: str) -> dict[str, Run]:
    runs: dict[str, Run] = {}
    for side, level in DIRECT_SIDES[link].items():
        name = _name(link, side)
        influx = dataclasses.replace(ctx.scratch.influx(_slug(name)), url=url)
        direct = DirectSide(influx, LANES, gzip_level=level)
        stack.callback(direct.close)
        runs[name] = direct.run_all
    return runs


def _warm_up(ctx: Context, runs: dict[str, Run]) -> None:
    """One small epoch per side: creating a database's first shard, opening
    connections and pools stay out of the timing."""
    lines = [epoch_lines(WARM_UP_POINTS, ctx.seeds.take())]
    for run in runs.values():
        run(lines)


def _name(link: Link, side: str) -> str:
    return f"{link.name}: {side}"


def _slug(name: str) -> str:
    """A side's name as a database role: ``rt_20_ms_100_Mbit_s_twophase``."""
    return "rt_" + re.sub(r"\W+", "_", name).strip("_")


def _result(got: dict[str, list[float]], size: int, count: int) -> dict[str, Any]:
    parts, shortfall = {}, {}
    for link, side, other, target in ROWS:
        part = f"{size_label(size)}, {link.name}: {side} / {other}"
        pair = ((side, got[_name(link, side)]), (other, got[_name(link, other)]))
        parts[part] = compared(
            "points/s",
            pair,
            target,
            points=size,
            epochs=count,
            round_trip_ms=ROUND_TRIP_S * 1000,
            bandwidth_mbps=link.bandwidth_bps / 1e6 if link.bandwidth_bps else None,
        )
        if target:
            shortfall[part] = parts[part]["ratio"] / target
    worst = parts[min(shortfall, key=shortfall.__getitem__)]
    holds = all(parts[part]["holds"] for part in shortfall)
    return {**worst, "holds": holds, "parts": parts}
