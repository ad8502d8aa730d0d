"""``python -m bench request_size [--points N] [--repeats R] [--sizes ...]``: promote
request size.

What ``target_batch_points`` (and ``target_batch_bytes``, kept out of the way here:
``--bytes-per-point`` bytes a point) costs and gives. One epoch of N points is
staged once with the defaults (``compression = gzip``, 5,000-line chunks, 4 lanes)
and decided; then, per link, it is sent R times per request size through
``TargetDelivery.send`` -- the driver's own path: reading the staged chunks from
PostgreSQL, the fencing-free send of their gzip members end to end over the lanes
to InfluxDB 1.x -- the sizes in a rotating order, so that each meets the same
machine noise. Links: InfluxDB on loopback, and through the test kit's proxy in a
process of its own holding each answer 20 ms (``bench/proxies.py``). Measured per
send: points/s (wall) and the driver's CPU seconds per million points (this
process, all threads; InfluxDB, PostgreSQL and the proxy run elsewhere). Medians.
Re-sending the same points overwrites them with themselves, so every send writes
the same. Prints a table; writes ``bench/results/request-size-<stamp>.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.context import MAIN, TP_INFLUX
from bench.lines import epoch_lines
from bench.proxies import ProxyProcess
from bench.report import RESULTS, command, finish, machine, stamp, write_json
from bench.servers import Scratch, Servers, scratch
from twophase.config import TargetConfig, TwoPhaseConfig
from twophase.influx.api import make_writer
from twophase.model import EpochPlan
from twophase.protocol.commit.runtime import TwoPhase

SINK = "bench-request-size"
DELAY_S = 0.020  # the proxy's hold on each answer: metric 10's link
SIZES = (5_000, 10_000, 20_000, 50_000)
# Bytes a request may hold per point allowed, so that the point count decides (the
# bench's lines are about 130 bytes).
BYTES_PER_POINT = 400


def staged(config: TwoPhaseConfig, points: int) -> EpochPlan:
    """One decided epoch of ``points`` points, staged as 4 writes, and its plan."""
    with TwoPhase.open(config) as tp:
        lease = tp.begin_run(SINK, "run", "request-size")
        lines = epoch_lines(points, 0)
        messages = [
            tp.stager.stage(SINK, 0, lines[part::4], partition_id=part) for part in range(4)
        ]
        tp.ledger.decide(lease, 0, messages)
        return tp.reader.plan(SINK, 0)


def sized(config: TwoPhaseConfig, url: str, size: int, per_point: int) -> TwoPhaseConfig:
    influx = dataclasses.replace(
        config.target, url=url, batch_points=size, batch_bytes=size * per_point
    )
    return dataclasses.replace(config, target=influx)


class Counted:
    """The configured writer, counting its requests (lanes write from threads)."""

    def __init__(self, config: TargetConfig) -> None:
        self._inner = make_writer(config)
        self._lock = threading.Lock()
        self.requests = 0

    def write(self, body: bytes, gzipped: bool = False) -> None:
        with self._lock:
            self.requests += 1
        self._inner.write(body, gzipped)

    def read(self, statement: str) -> Iterable[dict[str, Any]]:
        return self._inner.read(statement)

    def close(self) -> None:
        self._inner.close()


@dataclass
class Side:
    """One request size on one link: its parts and its writer."""

    tp: TwoPhase
    writer: Counted


def one_send(side: Side, plan: EpochPlan) -> tuple[float, float, int]:
    """(seconds, driver CPU seconds, requests) of one send of the plan."""
    delivery = next(iter(side.tp.deliveries.values()))
    before = side.writer.requests
    wall, cpu = time.perf_counter(), time.process_time()
    delivery.send(plan)
    took, used = time.perf_counter() - wall, time.process_time() - cpu
    return took, used, side.writer.requests - before


@contextmanager
def opened(
    config: TwoPhaseConfig, url: str, sizes: Sequence[int], per_point: int
) -> Iterator[dict[int, Side]]:
    with ExitStack() as stack:
        sides = {}
        for size in sizes:
            each = sized(config, url, size, per_point)
            writer = Counted(each.target)
            tp = stack.enter_context(TwoPhase.open(each, writer=writer))
            sides[size] = Side(tp, writer)
        yield sides


def measure_link(
    config: TwoPhaseConfig, plan: EpochPlan, url: str, args: argparse.Namespace
) -> dict[str, Any]:
    points = plan_points(plan)
    runs: dict[int, list[tuple[float, float, int]]] = {size: [] for size in args.sizes}
    with opened(config, url, args.sizes, args.bytes_per_point) as sides:
        for size in args.sizes:  # warm-up: connections, InfluxDB's series
            one_send(sides[size], plan)
        for r in range(args.repeats):
            shift = r % len(args.sizes)
            for size in [*args.sizes[shift:], *args.sizes[:shift]]:
                runs[size].append(one_send(sides[size], plan))
    result = {}
    for size, sends in runs.items():
        rate = statistics.median(points / wall for wall, _, _ in sends)
        cpu = statistics.median(cpu / points * 1e6 for _, cpu, _ in sends)
        result[str(size)] = {
            "points_per_s": round(rate),
            "driver_cpu_s_per_million_points": round(cpu, 4),
            "requests_per_send": max(requests for _, _, requests in sends),
            "sends": [{"wall_s": round(w, 4), "cpu_s": round(c, 4)} for w, c, _ in sends],
        }
    return result


def plan_points(plan: EpochPlan) -> int:
    return sum(write.points for write in plan.writes)


def measure(made: Scratch, args: argparse.Namespace) -> dict[str, Any]:
    config = made.config(MAIN, TP_INFLUX)
    plan = staged(config, args.points)
    links: dict[str, Any] = {"loopback": measure_link(config, plan, config.target.url, args)}
    with ProxyProcess(config.target.url, DELAY_S) as proxy:
        links["20 ms"] = measure_link(config, plan, proxy.url, args)
    return links


def table(links: dict[str, Any]) -> str:
    rows = ["link      points/request  requests  points/s   driver CPU s / 1M points"]
    for link, sizes in links.items():
        for size, got in sizes.items():
            rows.append(
                f"{link:9} {int(size):14,}  {got['requests_per_send']:8}  "
                f"{got['points_per_s']:9,}  {got['driver_cpu_s_per_million_points']:10.3f}"
            )
    return "\n".join(rows)


def main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench request_size", description=__doc__)
    ap.add_argument("--points", type=int, default=500_000, help="points of the epoch")
    ap.add_argument("--repeats", type=int, default=3, help="sends per size and link")
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="points/request")
    ap.add_argument("--bytes-per-point", type=int, default=BYTES_PER_POINT)
    ap.add_argument("--json", type=Path, help="results file (default: bench/results/)")
    args = ap.parse_args(argv)
    started = stamp()
    with scratch(Servers.from_env()) as made:
        links = measure(made, args)
    results = {
        "started": started,
        "command": command("request_size", argv),
        "points": args.points,
        "repeats": args.repeats,
        "bytes_per_point_allowed": args.bytes_per_point,
        "proxy_delay_s": DELAY_S,
        "machine": machine(),
        "links": links,
    }
    path = write_json(results, args.json or RESULTS / f"request-size-{started}.json")
    return finish(table(links), {"json": path})
