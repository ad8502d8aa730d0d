"""A child process that drives the protocol like a Spark driver would, for crash tests.

It keeps its own "Spark commit log" (a file of epochs Spark considers done)
and on start replays from the first epoch not in it, exactly as Spark restarts
from a checkpoint whose offset log is ahead of its commit log. It claims the
sink as a query's start does (``TwoPhase.claim``: what older runs left
PRECOMMITTED is promoted before the first epoch, or without any epoch when
the log is complete). Set TWOPHASE_CRASH_AT to have it SIGKILL itself at a
named protocol step; or ``--arm-last PLAN`` with TWOPHASE_CRASH_PLAN to arm a
crash plan (:mod:`twophase.faults`) only once every epoch but the last is
promoted, so that its count starts in the last epoch.

    python -m tests.integration.crash_driver --staging-url U --influx-url U \
        --influx-db D --sink S --epochs N --spark-log FILE --run-id R
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

from twophase.config import (
    InfluxDBSettings,
    NamedTarget,
    TargetConfig,
    TwoPhaseConfig,
    load_staging_config,
)
from twophase.faults import PLAN_ENV
from twophase.protocol.commit.runtime import TwoPhase

MEASUREMENT = "crash"
PARTITIONS = 3
POINTS_PER_PARTITION = 100
QUERY = "query-1"
BAD_EPOCH = 1  # this epoch carries a point InfluxDB rejects (field type conflict)


def epoch_lines(epoch: int, partition: int, perturb: bool = False) -> list[str]:
    """One task's output. ``perturb`` models a non-deterministic recomputation on
    replay (processing-time values, changed upstream data): a replayed attempt
    of an already decided epoch stages *different* values, which must never
    reach InfluxDB (I1, I4)."""
    shift = 0.25 if perturb else 0.0
    base = 1_600_000_000_000_000_000 + epoch * 10_000_000_000 + partition * 1_000_000_000
    out = [
        f"{MEASUREMENT},part={partition},k={i % 7} v={epoch * 1000 + i + 0.5 + shift},n={i}i "
        f"{base + i}"
        for i in range(POINTS_PER_PARTITION)
    ]
    if epoch == BAD_EPOCH and partition == 0:
        out.append(f'{MEASUREMENT},part=0,k=0 v="not a float" {base + 999_999}')
    return out


def read_log(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def append_log(path: Path, epoch: int) -> None:
    with path.open("a") as handle:
        handle.write(f"{epoch}\n")
        handle.flush()
        os.fsync(handle.fileno())


def main() -> None:
    ap = argparse.ArgumentParser()
    for name in ("staging-url", "influx-url", "influx-db", "sink", "spark-log", "run-id"):
        ap.add_argument(f"--{name}", required=True)
    ap.add_argument("--epochs", type=int, required=True)
    ap.add_argument("--perturb", default="", help="comma-separated epochs to recompute differently")
    ap.add_argument("--batch-points", type=int, default=40, help="points per InfluxDB request")
    ap.add_argument("--promotion", default="inline", help="inline or background")
    ap.add_argument("--lanes", type=int, default=1, help="promote_connections")
    ap.add_argument("--compression", default="gzip", help="gzip or none")
    ap.add_argument("--chunk-points", type=int, default=None, help="staging_chunk_points")
    ap.add_argument("--arm-last", default=None, help="crash plan (JSON) armed for the last epoch")
    ap.add_argument("--gc-interval", default="0", help="gc_interval (0: no automatic GC)")
    ap.add_argument("--retention", default="1h", help="retention of delivered points")
    ap.add_argument("--influx-url-b", default=None, help="a second target, b (a: --influx-url)")
    ap.add_argument("--influx-db-b", default=None, help="target b's database")
    ap.add_argument("--retry-deadline", type=float, default=30, help="target_retry_deadline (s)")
    ap.add_argument("--session-timeout", default="30s", help="staging_session_timeout")
    args = ap.parse_args()

    config = TwoPhaseConfig(
        load_staging_config(
            env={},
            staging_url=args.staging_url,
            promote_connections=args.lanes,
            gc_interval=args.gc_interval,
            retention=args.retention,
            compression=args.compression,
            staging_session_timeout=args.session_timeout,
            **({"staging_chunk_points": args.chunk_points} if args.chunk_points else {}),
        ),
        influx_config(args),
    )
    log = Path(args.spark_log)
    done = read_log(log)
    start = max(done) + 1 if done else 0
    perturbed = {int(e) for e in args.perturb.split(",") if e}
    with TwoPhase.open(config) as tp:
        lease = tp.claim(args.sink, args.run_id, QUERY)
        for epoch in range(start, args.epochs):
            if args.arm_last and epoch == args.epochs - 1:
                tp.committer.drain()  # the epoch before promoted: the plan counts from here
                arm(args.arm_last)
            lines = [epoch_lines(epoch, p, epoch in perturbed) for p in range(PARTITIONS)]
            messages = [
                tp.stager.stage(
                    args.sink, epoch, part, partition_id=p, run_id=args.run_id, query_id=QUERY
                )
                for p, part in enumerate(lines)
            ]
            outcome = tp.committer.commit(lease, epoch, messages)
            print(f"epoch {epoch} {outcome.state} replay={outcome.replay}", flush=True)
            append_log(log, epoch)


def influx_config(args: argparse.Namespace) -> TargetConfig:
    """One target; with ``--influx-url-b``, targets a and b (b given up after 1 s)."""
    config = TargetConfig(
        url=args.influx_url,
        batch_points=args.batch_points,
        retry_deadline_s=args.retry_deadline,
        retry_initial_s=0.05,
        retry_max_s=1,
        promotion=args.promotion,
        influxdb=InfluxDBSettings(api="v1", database=args.influx_db),
    )
    if args.influx_url_b is None:
        return config
    b = config.with_fields(url=args.influx_url_b, database=args.influx_db_b)
    if args.influx_url_b.startswith("postgresql:"):  # its tables made from what it is sent
        b = b.with_fields(database=None, create_tables=True)
    targets = (NamedTarget("a", config), NamedTarget("b", b))
    return dataclasses.replace(config, targets=targets, target_deadline_s=1.0)


def arm(plan: str) -> None:
    """Write the crash plan where TWOPHASE_CRASH_PLAN points, whole (a reader never
    sees half of it)."""
    path = Path(os.environ[PLAN_ENV])
    hidden = path.with_name(path.name + ".tmp")
    hidden.write_text(plan)
    hidden.replace(path)


if __name__ == "__main__":
    main()
