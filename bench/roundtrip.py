"""Metric 10: promotion to an InfluxDB 20 ms away, over 1 and 4 lanes.

Every request to InfluxDB goes through the test kit's proxy
(``tests/integration/faultproxy.py``), which holds each answer 20 ms: a
round trip as to a server in another region. (``tc netem`` in a network
namespace would be closer to a real link, but this machine's kernel has no
netem qdisc.) PostgreSQL stays local, as it would beside the Spark driver.

Sides, each writing the same epochs back to back into an InfluxDB database
of its own, with the sides' order rotating per repeat:

- ``1 lane``: the core protocol as metric 1 runs it (stage, then commit:
  recover, decide, promote, mark), ``promote_connections = 1``;
- ``4 lanes``: the same with ``promote_connections = 4``;
- ``4 lanes background``: 4 lanes with ``promotion = background`` (staging
  epoch N+1 while N travels; the final drain inside the timing), reported;
- ``direct x1`` and ``direct x4``: what a user writes instead
  (:mod:`bench.direct`, none of twophase's code): the lines POSTed over one
  connection, or cut into four parts written at once, as four partitions do.

Targets: 4 lanes >= 0.9x direct x4, and >= 3x 1 lane.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from bench.background import Consecutive, rates
from bench.context import MAIN, Context
from bench.report import size_label
from bench.sides import DirectSide
from bench.stats import compared, rotated
from tests.integration.faultproxy import FaultProxy
from twophase.config import BACKGROUND, INLINE, TwoPhaseConfig
from twophase.protocol.runtime import TwoPhase

ROUND_TRIP_S = 0.020
LANES = 4
TO_DIRECT, TO_ONE_LANE = 0.9, 3.0
# side -> (lanes, promotion) of the twophase sides
TWOPHASE_SIDES = {
    "1 lane": (1, INLINE),
    f"{LANES} lanes": (LANES, INLINE),
    f"{LANES} lanes background": (LANES, BACKGROUND),
}


def measure_roundtrip(ctx: Context) -> dict[str, Any]:
    size, count, repeats = ctx.plan.roundtrip
    with FaultProxy.for_url(ctx.scratch.servers.influx_url) as proxy:
        proxy.delay_s = ROUND_TRIP_S
        opened = {name: _open(ctx, name, proxy.url, *how) for name, how in TWOPHASE_SIDES.items()}
        directs = {n: _direct(ctx, proxy.url, n) for n in (1, LANES)}
        try:
            runs = _runs(ctx, opened, directs, size, count)
            ctx.log(f"roundtrip: {count} x {size:,}-point epochs x {repeats}, 20 ms away")
            got = rotated(repeats, runs)
        finally:
            for side in directs.values():
                side.close()
            for tp in opened.values():
                tp.close()
    return _result(got, size, count)


def _open(ctx: Context, name: str, url: str, lanes: int, promotion: str) -> TwoPhase:
    config = ctx.scratch.config(MAIN, "rt_" + name.replace(" ", "_"))
    return TwoPhase.open(
        TwoPhaseConfig(
            dataclasses.replace(config.staging, lanes=lanes),
            dataclasses.replace(config.influx, url=url, promotion=promotion),
        )
    )


def _direct(ctx: Context, url: str, connections: int) -> DirectSide:
    influx = ctx.scratch.influx(f"rt_direct{connections}")
    return DirectSide(dataclasses.replace(influx, url=url), connections)


def _runs(
    ctx: Context,
    opened: dict[str, TwoPhase],
    directs: dict[int, DirectSide],
    size: int,
    count: int,
) -> dict[str, Callable[[int], float]]:
    rate = rates(ctx, size, count)
    runs: dict[str, Callable[[int], float]] = {}
    for name, tp in opened.items():
        runs[name] = rate(Consecutive(tp, "bench-rt-" + name.replace(" ", "-")).run)
    for connections, direct in directs.items():
        runs[f"direct x{connections}"] = rate(direct.run_all)
    return runs


def _result(got: dict[str, list[float]], size: int, count: int) -> dict[str, Any]:
    label = size_label(size)
    lanes, one, bg = f"{LANES} lanes", "1 lane", f"{LANES} lanes background"
    rows = [  # (part, side, other side, target or None)
        (f"{label} {lanes} / direct x{LANES}", lanes, f"direct x{LANES}", TO_DIRECT),
        (f"{label} {lanes} / {one}", lanes, one, TO_ONE_LANE),
        (f"{label} {one} / direct x1", one, "direct x1", None),
        (f"{label} {bg} / direct x{LANES}", bg, f"direct x{LANES}", None),
    ]
    parts, shortfall = {}, {}
    for part, side, other, target in rows:
        pair = ((side, got[side]), (other, got[other]))
        parts[part] = compared(
            "points/s", pair, target, points=size, epochs=count, round_trip_ms=ROUND_TRIP_S * 1000
        )
        if target:
            shortfall[part] = parts[part]["ratio"] / target
    worst = parts[min(shortfall, key=shortfall.__getitem__)]
    holds = all(parts[part]["holds"] for part in shortfall)
    return {**worst, "holds": holds, "parts": parts}
