"""One side of metric 2 between two versions of twophase: small epochs through one
version's protocol, in a process of its own.

``bench.versions`` runs this file's source with ``python -c`` in a checkout of
the version measured (its working directory first on ``sys.path``), so it
imports nothing of the bench and only the API both versions share:
``TwoPhase.open``, ``TwoPhase.claim``, ``Stager.stage``, ``Committer.commit``.
It prints one JSON line: the milliseconds of each measured epoch.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid

from twophase.config import InfluxDBSettings, TargetConfig, TwoPhaseConfig, load_staging_config
from twophase.protocol.commit.runtime import TwoPhase


def epoch_lines(epoch: int, points: int, offset: int) -> list[str]:
    """``points`` lines of a series each, at timestamps no other epoch writes."""
    ts = 1_700_000_000_000_000_000 + (offset + epoch) * 1_000_000
    return [f"fixed,s=s{i} v={epoch}i {ts + i}" for i in range(points)]


def main() -> None:
    ap = argparse.ArgumentParser()
    for name in ("staging-url", "influx-url", "influx-db", "sink"):
        ap.add_argument(f"--{name}", required=True)
    ap.add_argument("--points", type=int, default=10)
    ap.add_argument("--warm", type=int, default=20, help="epochs run before the clock")
    ap.add_argument("--epochs", type=int, default=100, help="epochs measured")
    ap.add_argument("--offset", type=int, default=0, help="epochs run by earlier children")
    args = ap.parse_args()
    influx = TargetConfig(
        url=args.influx_url, influxdb=InfluxDBSettings(api="v1", database=args.influx_db)
    )
    config = TwoPhaseConfig(load_staging_config(env={}, staging_url=args.staging_url), influx)
    millis = []
    with TwoPhase.open(config) as tp:
        lease = tp.claim(args.sink, uuid.uuid4().hex, "bench-versions")
        for number in range(args.warm + args.epochs):
            epoch = args.offset + number
            lines = epoch_lines(epoch, args.points, args.offset)
            started = time.perf_counter()
            message = tp.stager.stage(args.sink, epoch, lines)
            outcome = tp.committer.commit(lease, epoch, [message])
            elapsed = time.perf_counter() - started
            if outcome.promoted is None or outcome.promoted.delivered != args.points:
                raise SystemExit(f"epoch {epoch}: {outcome.state}, not delivered whole")
            if number >= args.warm:
                millis.append(round(elapsed * 1000, 4))
    print(json.dumps({"ms": millis}))


if __name__ == "__main__":
    main()
