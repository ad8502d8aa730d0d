"""A fresh process that promotes, writes or stages, for metrics 4 and 11 (memory) and 5
(recovery).

::

    python -m bench.child promote --staging-url URL --influx-url URL --influx-db DB --sink S
    python -m bench.child direct --influx-url URL --influx-db DB --points N --seeds 3,4,5
        [--stream]
    python -m bench.child stage --staging-url URL --sink S --points N --seeds 3
        --spool-memory BYTES

``promote`` opens the protocol like a restarted driver, claims the sink
(fencing the bench's own run) and promotes every PRECOMMITTED epoch
(``Committer.recover``). ``direct`` sends the lines of the given seeds
straight to InfluxDB, one epoch per seed: prebuilt before the clock starts,
or with ``--stream`` generated lazily in batches (the most frugal direct
writer), through :class:`bench.direct.DirectWriter`. ``stage`` stages the
lines of one seed as one write, from a generator (read once, as a Spark
task's rows), with the given ``staging_spool_memory``, as an executor's
task does. Each prints one JSON line: seconds, points, and the RSS before
and the peak RSS during the measured part.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

from bench import rss
from bench.direct import DirectWriter
from bench.lines import epoch_lines, iter_lines
from bench.sides import QUERY_ID
from twophase.config import InfluxDBSettings, TargetConfig, TwoPhaseConfig, load_staging_config
from twophase.protocol.commit.runtime import TwoPhase
from twophase.protocol.stage.stager import Stager
from twophase.store.database import Database


def parse(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.child")
    ap.add_argument("mode", choices=("promote", "direct", "stage"))
    ap.add_argument("--staging-url")
    ap.add_argument("--influx-url", default="")
    ap.add_argument("--influx-db", default="")
    ap.add_argument("--sink")
    ap.add_argument("--points", type=int, default=0)
    ap.add_argument("--seeds", default="")
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--spool-memory", type=int, default=None)
    return ap.parse_args(argv)


def promote(args: argparse.Namespace, influx: TargetConfig) -> dict[str, Any]:
    started = time.perf_counter()
    staging = load_staging_config(env={}, staging_url=args.staging_url)
    with TwoPhase.open(TwoPhaseConfig(staging, influx)) as tp:
        committer = tp.committer
        lease = tp.begin_run(args.sink, uuid.uuid4().hex, QUERY_ID)
        opened = time.perf_counter()
        before, reset = rss.current_kb(), rss.reset_peak()
        promoted = committer.recover(lease)
        done = time.perf_counter()
    points = sum(p.delivered for p in promoted)
    return _result(
        done - started, points, before, reset, epochs=len(promoted), open_s=opened - started
    )


def direct(args: argparse.Namespace, influx: TargetConfig) -> dict[str, Any]:
    seeds = [int(s) for s in args.seeds.split(",") if s]
    epochs = [] if args.stream else [epoch_lines(args.points, seed) for seed in seeds]
    started = time.perf_counter()
    writer = DirectWriter(influx.url, influx.influxdb.database or "")
    opened = time.perf_counter()
    before, reset = rss.current_kb(), rss.reset_peak()
    if args.stream:
        for seed in seeds:
            writer.write(iter_lines(args.points, seed))
    for lines in epochs:
        writer.write(lines)
    done = time.perf_counter()
    writer.close()
    points = args.points * len(seeds)
    return _result(
        done - started, points, before, reset, epochs=len(seeds), open_s=opened - started
    )


def stage(args: argparse.Namespace, influx: TargetConfig) -> dict[str, Any]:
    overrides = {} if args.spool_memory is None else {"staging_spool_memory": args.spool_memory}
    staging = load_staging_config(env={}, staging_url=args.staging_url, **overrides)
    (seed,) = (int(s) for s in args.seeds.split(","))
    with Database(staging) as db:
        stager = Stager(db, staging)
        before, reset = rss.current_kb(), rss.reset_peak()
        started = time.perf_counter()
        message = stager.stage(args.sink, 0, iter_lines(args.points, seed))
        done = time.perf_counter()
    return _result(done - started, message.points, before, reset, spool_memory=staging.spool_memory)


def _result(
    seconds: float, points: int, before_kb: int, reset: bool, **extra: Any
) -> dict[str, Any]:
    peak = rss.peak_kb()
    return {
        "seconds": seconds,
        "points": points,
        "rss_before_mb": before_kb / 1024,
        "peak_mb": peak / 1024,
        "growth_mb": max(0, peak - before_kb) / 1024,
        "peak_reset": reset,
        **extra,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    influx = TargetConfig(
        url=args.influx_url, influxdb=InfluxDBSettings(api="v1", database=args.influx_db)
    )
    result = {"promote": promote, "direct": direct, "stage": stage}[args.mode](args, influx)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
