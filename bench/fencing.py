"""``python -m bench fencing [--points N] [--repeats R]``: what promotion's fencing check costs.

A promotion reads the sink's fencing token before every request and every retry
of one (``Ledger.check_lease``, I5). This times the same promotion with and
without that read: one epoch of N points staged and decided once per lane
setting (``promote_connections`` 1 and 4), then sent R times each way,
interleaved (:func:`bench.stats.interleaved`), through ``Promoter.send`` -- the
read from PostgreSQL and the requests to InfluxDB; the mark is left out (the
same either way). Prints one line per lane setting: both sides' median
points/s, their ratio, the median of each repeat's own ratio (its two sends
ran back to back, under the same load), the reads per send, and the time the
reads took inside the sends (and alone) as a share of the sends' time.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence

from bench.context import MAIN, TP_INFLUX
from bench.lines import epoch_lines
from bench.servers import Scratch, Servers, scratch
from bench.stats import interleaved
from twophase.model import EpochPlan, Lease
from twophase.protocol.commit.runtime import TwoPhase

SINK = "bench-fencing"


def staged(tp: TwoPhase, points: int) -> tuple[Lease, EpochPlan]:
    """One decided epoch of ``points`` points, staged as 4 writes, and its plan."""
    lease = tp.begin_run(SINK, "run", "fencing")
    lines = epoch_lines(points, 0)
    messages = [tp.stager.stage(SINK, 0, lines[part::4], partition_id=part) for part in range(4)]
    tp.ledger.decide(lease, 0, messages)
    return lease, tp.reader.plan(SINK, 0)


def check_alone(tp: TwoPhase, lease: Lease, calls: int = 2000) -> float:
    """The median time of one check, in microseconds."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        tp.ledger.check_lease(lease)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def compare(made: Scratch, lanes: int, points: int, repeats: int) -> str:
    config = made.config(f"{MAIN}{lanes}", TP_INFLUX)
    config = dataclasses.replace(config, staging=dataclasses.replace(config.staging, lanes=lanes))
    with TwoPhase.open(config) as tp:
        lease, plan = staged(tp, points)
        reads, inside = [0], [0.0]  # reads made, seconds spent in them (summed over lanes)

        def check() -> None:
            start = time.perf_counter()
            tp.ledger.check_lease(lease)
            reads[0] += 1
            inside[0] += time.perf_counter() - start

        def rate(before: Callable[[], None] | None) -> Callable[[int], float]:
            def one(_: int) -> float:
                start = time.perf_counter()
                next(iter(tp.deliveries.values())).send(plan, before_request=before)
                return points / (time.perf_counter() - start)

            return one

        rate(None)(0)  # warm-up: connections, series created in InfluxDB
        checked, plain = interleaved(repeats, rate(check), rate(None))
        alone = check_alone(tp, lease)
    ratio = statistics.median(checked) / statistics.median(plain)
    # each repeat's two sends ran back to back: their ratio sees the same machine load
    paired = statistics.median(c / u for c, u in zip(checked, plain, strict=True))
    send_s = sum(points / rate for rate in checked)
    return (
        f"lanes {lanes}: {points:,} points, {repeats} sends per side: checked "
        f"{statistics.median(checked):,.0f} points/s, unchecked {statistics.median(plain):,.0f} "
        f"points/s, ratio {ratio:.3f}, paired {paired:.3f}; {reads[0] / repeats:.0f} reads per "
        f"send, {inside[0] / reads[0] * 1e6:.0f} us each in the sends ({alone:.0f} us alone), "
        f"{inside[0] / lanes / send_s:.1%} of the checked sends' time per lane"
    )


def main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench fencing", description=__doc__)
    ap.add_argument("--points", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=7, help="sends per side and lane setting")
    ap.add_argument("--lanes", type=int, nargs="+", default=[1, 4])
    args = ap.parse_args(argv)
    with scratch(Servers.from_env()) as made:
        for lanes in args.lanes:
            print(compare(made, lanes, args.points, args.repeats), flush=True)
    return 0
