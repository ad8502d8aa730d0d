"""Deterministic sample session events for ``jobs/session_metrics.py``, and their expected totals.

::

    python jobs/generate_events.py --out DIR [--files 24] [--events-per-file 400] [--seed 7]
    python jobs/generate_events.py --expect DIR      # the aggregates, computed without Spark

Each file holds JSON-lines events in event-time order with bounded disorder
(an event is at most ``--disorder`` seconds older than the newest before
it, well inside the job's 10-minute watermark, so Spark drops none as late),
plus some malformed lines of several kinds. Files are written atomically
(a hidden temporary name, then a rename) with increasing modification
times, so Spark's file source picks them up whole and in order, also while
a query runs. The same ``--seed`` gives byte-identical files.

``--expect`` reads files and computes what a target must hold afterwards,
independently of Spark: per 5-minute window end, stream and ISP, the event
count, the exact distinct users and the byte sums; and how many lines are
malformed. Its validity rules are the job's, restated in plain Python for
the kinds of lines this generator writes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_START = 1545184200  # 2018-12-19T01:50:00Z, the seed article's sample day
STREAMS = ("s1", "s2", "s3", "s4")
ISPS = ("acme", "globex", "initech")
USERS = 150
MALFORMED_KINDS = (
    "truncated",
    "not_json",
    "no_timestamp",
    "bytes_text",
    "bytes_float",
    "empty_stream",
    "negative_bytes",
)
MIN_EVENT_SECONDS = -62135596800
MAX_EVENT_SECONDS = 253402300799
INT64_MAX = 2**63 - 1
FILE_PREFIX = "events-"


# --- generating ---------------------------------------------------------------------------


def generate(
    out: Path,
    files: int = 24,
    events_per_file: int = 400,
    seed: int = 7,
    start: int = DEFAULT_START,
    seconds_per_file: float = 60.0,
    disorder: float = 45.0,
    malformed_every: int = 50,
) -> list[Path]:
    """Write ``files`` event files into ``out``; returns their paths in order.

    Roughly one line in ``malformed_every`` is malformed (0: none).
    """
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    now = time.time()
    paths = []
    for index in range(files):
        first = start + index * seconds_per_file
        lines = list(
            file_lines(rng, first, seconds_per_file, events_per_file, disorder, malformed_every)
        )
        paths.append(write_atomically(out, index, lines, mtime=now + index * 0.01))
    return paths


def file_lines(
    rng: random.Random,
    first: float,
    span: float,
    count: int,
    disorder: float,
    malformed_every: int,
) -> Iterator[str]:
    """``count`` lines whose base times rise evenly over ``span`` seconds from ``first``."""
    for i in range(count):
        base = first + span * i / count
        event = random_event(rng, base - rng.uniform(0, disorder))
        if malformed_every and rng.randrange(malformed_every) == 0:
            yield malformed(rng, event)
        else:
            yield json.dumps(event)


def random_event(rng: random.Random, ts: float) -> dict[str, Any]:
    return {
        "timestamp": round(ts, 3),
        "stream_id": rng.choice(STREAMS),
        "isp": rng.choice(ISPS),
        "user_id": f"u{rng.randrange(USERS)}",
        "bytes_p2p": rng.randrange(0, 5_000_000),
        "bytes_cdn": rng.randrange(0, 5_000_000),
    }


def malformed(rng: random.Random, event: dict[str, Any]) -> str:
    """One malformed line of a random kind, built from a valid event."""
    return malformed_line(rng.choice(MALFORMED_KINDS), event)


def malformed_line(kind: str, event: dict[str, Any]) -> str:
    """The malformed line of ``kind`` (one of :data:`MALFORMED_KINDS`) built from ``event``."""
    bad = dict(event)
    if kind == "truncated":
        text = json.dumps(event)
        return text[: len(text) // 2]
    if kind == "not_json":
        return f"session {event['stream_id']} ended at {event['timestamp']}"
    if kind == "no_timestamp":
        del bad["timestamp"]
    elif kind == "bytes_text":
        bad["bytes_p2p"] = "lots"
    elif kind == "bytes_float":
        bad["bytes_cdn"] = event["bytes_cdn"] + 0.5
    elif kind == "empty_stream":
        bad["stream_id"] = ""
    elif kind == "negative_bytes":
        bad["bytes_p2p"] = -1 - event["bytes_p2p"]
    else:
        raise ValueError(f"unknown kind of malformed line {kind!r}")
    return json.dumps(bad)


def write_atomically(out: Path, index: int, lines: Sequence[str], mtime: float) -> Path:
    """``events-NNNNN.jsonl`` written under a hidden name, then renamed into place."""
    final = out / f"{FILE_PREFIX}{index:05d}.jsonl"
    hidden = out / f".{final.name}.tmp"
    hidden.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    os.utime(hidden, (mtime, mtime))
    hidden.replace(final)
    return final


# --- expected results ---------------------------------------------------------------------


@dataclass
class Totals:
    """One window, stream and ISP: what the job's point must hold."""

    events: int = 0
    bytes_p2p: int = 0
    bytes_cdn: int = 0
    users: set[str] = field(default_factory=set)


@dataclass
class Expected:
    """Aggregates keyed by (window end in epoch seconds, stream_id, isp), and line counts."""

    stats: dict[tuple[int, str, str], Totals] = field(default_factory=dict)
    valid: int = 0
    malformed: int = 0


def expected(paths: Iterable[Path], window_s: int = 300) -> Expected:
    """The aggregates of every valid event in ``paths`` (as the job computes them)."""
    result = Expected()
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            event = valid_event(line)
            if event is None:
                result.malformed += 1
                continue
            result.valid += 1
            key = (window_end(event["timestamp"], window_s), event["stream_id"], event["isp"])
            totals = result.stats.setdefault(key, Totals())
            totals.events += 1
            totals.bytes_p2p += event["bytes_p2p"]
            totals.bytes_cdn += event["bytes_cdn"]
            totals.users.add(event["user_id"])
    return result


def valid_event(line: str) -> dict[str, Any] | None:
    """The event, or None when the job classifies the line as malformed."""
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if not isinstance(event, dict):
        return None
    ts: Any = event.get("timestamp")
    if not _is_number(ts) or not math.isfinite(ts):
        return None
    if not MIN_EVENT_SECONDS <= ts <= MAX_EVENT_SECONDS:
        return None
    for name in ("stream_id", "isp", "user_id"):
        if not isinstance(event.get(name), str) or not event[name]:
            return None
    for name in ("bytes_p2p", "bytes_cdn"):
        value: Any = event.get(name)
        if not _is_int(value) or not 0 <= value <= INT64_MAX:
            return None
    return event


def window_end(ts: float, window_s: int) -> int:
    """Spark's tumbling window end, in seconds, for an event at ``ts`` seconds.

    Spark stores ``timestamp_seconds(ts)`` as ``(long)(ts * 1e6)`` microseconds
    (truncated) and starts windows at multiples of the window length.
    """
    micros = int(ts * 1_000_000)
    width = window_s * 1_000_000
    return (micros - micros % width + width) // 1_000_000


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def event_files(directory: Path) -> list[Path]:
    """The event files of a directory, in name order (hidden temporary files excluded)."""
    return sorted(directory.glob(f"{FILE_PREFIX}*.jsonl"))


def expected_json(result: Expected) -> dict[str, Any]:
    rows = [
        {
            "window_end": end,
            "stream_id": stream,
            "isp": isp,
            "events": t.events,
            "users": len(t.users),
            "bytes_p2p": t.bytes_p2p,
            "bytes_cdn": t.bytes_cdn,
        }
        for (end, stream, isp), t in sorted(result.stats.items())
    ]
    return {"valid": result.valid, "malformed": result.malformed, "stats": rows}


# --- command line ---------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="generate_events", description=__doc__.split("\n")[0])
    target = ap.add_mutually_exclusive_group(required=True)
    target.add_argument("--out", type=Path, help="write event files into this directory")
    target.add_argument("--expect", type=Path, help="print the expected aggregates of a directory")
    ap.add_argument("--files", type=int, default=24)
    ap.add_argument("--events-per-file", type=int, default=400)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--start", type=int, default=DEFAULT_START, help="first event time (epoch s)")
    ap.add_argument("--seconds-per-file", type=float, default=60.0)
    ap.add_argument("--disorder", type=float, default=45.0, help="max event-time disorder (s)")
    ap.add_argument(
        "--malformed-every", type=int, default=50, help="about one malformed line in N (0: none)"
    )
    ap.add_argument("--window-seconds", type=int, default=300)
    args = ap.parse_args(argv)
    if args.expect:
        print(
            json.dumps(
                expected_json(expected(event_files(args.expect), args.window_seconds)), indent=1
            )
        )
        return 0
    paths = generate(
        args.out,
        args.files,
        args.events_per_file,
        args.seed,
        args.start,
        args.seconds_per_file,
        args.disorder,
        args.malformed_every,
    )
    print(f"wrote {len(paths)} files to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
