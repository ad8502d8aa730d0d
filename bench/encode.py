"""``python -m bench encode [--rows N] [--repeats N] [--json FILE]``: encoding on executors.

CPU seconds per million points of turning one Arrow record batch into line protocol, as
a staging task does it, two ways:

* ``rows``: what staging did before columnar encoding: ``batch.to_pylist()`` and
  [`PointBuilder.convert`][twophase.points.builder.PointBuilder.convert] over the dicts;
* ``columnar``: [`ColumnarEncoder.convert`][twophase.points.columnar.ColumnarEncoder.convert]
  over the batch (``pyarrow.compute``).

Two shapes, 100k rows each by default: ``seeds``, the rows ``jobs/session_metrics.py``
writes (``stream_stats``: tags ``isp`` and ``stream_id``, four integer fields, the
window's end in seconds: the lines of ``bench/lines.py``), and ``mixed``, one point per row with
three tags, six fields of every kind (floats, an integer, a string, a boolean) and a
Spark timestamp column (microseconds, UTC).
Both ways' items are compared first (they must be equal); then each is timed
``--repeats`` times, alternating, with ``time.process_time`` (every thread of this
process: Arrow's too). Medians. No servers. Writes ``bench/results/encode-<stamp>.json``
and prints a table. A micro-benchmark, not a test: nothing here has a target.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bench.lines import ISPS, MEASUREMENT, STREAMS
from bench.report import RESULTS, command, finish, machine, stamp, write_json
from twophase.points.builder import PointBuilder, PointSpec
from twophase.points.columnar import ColumnarEncoder

T0 = datetime(2026, 11, 27, tzinfo=timezone.utc)
SHAPES: dict[str, PointSpec] = {
    "seeds": PointSpec(MEASUREMENT, ("isp", "stream_id"), None, "window_end", "s"),
    "mixed": PointSpec("host_stats", ("host", "region", "dc"), None, "time"),
}


def seeds_batch(rows: int) -> pa.RecordBatch:
    """``bench/lines.py``'s points as the Arrow batch a task of ``jobs/session_metrics.py``
    hands over: the window's end in whole seconds (``unix_seconds``), one window per 300
    series."""
    i = np.arange(rows, dtype=np.int64)
    stamps = int(T0.timestamp()) + i // (len(ISPS) * STREAMS)
    return pa.record_batch(
        {
            "isp": pa.array(np.array(ISPS)[i % 3]),
            "stream_id": pa.array(np.char.add("s", ((i // 3) % STREAMS).astype(str))),
            "bytes_cdn": i * 7 % 100_000,
            "bytes_p2p": i * 13 % 100_000,
            "events": i % 500,
            "users": i % 97,
            "window_end": stamps,
        }
    )


def mixed_batch(rows: int) -> pa.RecordBatch:
    """One point per row: three tags, floats of every size, an integer, text, a flag."""
    rng = np.random.default_rng(7)
    i = np.arange(rows, dtype=np.int64)
    stamps = pa.array((T0.timestamp() * 1e6 + i).astype(np.int64), pa.timestamp("us", "UTC"))
    return pa.record_batch(
        {
            "host": pa.array(np.char.add("web-", (i % 500).astype(str))),
            "region": pa.array(np.array(["eu-west", "us-east", "ap-south"])[i % 3]),
            "dc": pa.array(np.array(["a", "b"])[i % 2]),
            "cpu": rng.random(rows) * 100,
            "load": np.round(rng.random(rows) * 8, 2),
            "bytes": rng.lognormal(20, 4, rows),  # some over 1e10: repr's share
            "requests": rng.integers(0, 1_000_000, rows),
            "status": pa.array(np.array(["ok", "degraded", 'say "hi"', "a b,c=d"])[i % 4]),
            "healthy": i % 5 != 0,
            "time": stamps,
        }
    )


def by_rows(spec: PointSpec, batch: pa.RecordBatch) -> list[Any]:
    return list(PointBuilder(spec).convert(batch.to_pylist()))


def columnar(spec: PointSpec, batch: pa.RecordBatch) -> list[Any]:
    return list(ColumnarEncoder(PointBuilder(spec)).convert([batch]))


WAYS: dict[str, Callable[[PointSpec, pa.RecordBatch], list[Any]]] = {
    "rows": by_rows,
    "columnar": columnar,
}


def cpu_seconds(way: Callable[[PointSpec, pa.RecordBatch], list[Any]], *args: Any) -> float:
    start = time.process_time()
    way(*args)
    return time.process_time() - start


def measure(rows: int, repeats: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for shape, make in (("seeds", seeds_batch), ("mixed", mixed_batch)):
        spec, batch = SHAPES[shape], make(rows)
        if by_rows(spec, batch) != columnar(spec, batch):
            raise SystemExit(f"{shape}: the two ways give different items")
        raw: dict[str, list[float]] = {way: [] for way in WAYS}
        for repeat in range(repeats):
            order = list(WAYS) if repeat % 2 == 0 else list(reversed(WAYS))
            for way in order:
                raw[way].append(cpu_seconds(WAYS[way], spec, batch))
        per_million = {way: statistics.median(s) / rows * 1e6 for way, s in raw.items()}
        results[shape] = {
            "cpu_s_per_million_points": {way: round(v, 3) for way, v in per_million.items()},
            "speedup": round(per_million["rows"] / per_million["columnar"], 1),
            "raw_cpu_s": raw,
        }
    return results


def main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench encode", description=__doc__)
    ap.add_argument("--rows", type=int, default=100_000, help="rows per batch")
    ap.add_argument("--repeats", type=int, default=5, help="timings per way and shape")
    ap.add_argument("--json", type=Path, help="results file (default: bench/results/encode-*)")
    args = ap.parse_args(argv)
    started = stamp()
    results: dict[str, Any] = {
        "started": started,
        "command": command("encode", argv),
        "rows": args.rows,
        "repeats": args.repeats,
        "pyarrow": pa.__version__,
        "machine": machine(),
        "shapes": measure(args.rows, args.repeats),
    }
    path = write_json(results, args.json or RESULTS / f"encode-{started}.json")
    lines = ["shape   rows (CPU s / 1M points)   columnar   speed-up"]
    for shape, figures in results["shapes"].items():
        cpu = figures["cpu_s_per_million_points"]
        lines.append(
            f"{shape:7} {cpu['rows']:26.2f}   {cpu['columnar']:8.2f}   {figures['speedup']}x"
        )
    return finish("\n".join(lines), {"json": path})
