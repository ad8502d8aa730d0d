"""Metric 7: a scrape of the exporter stays cheap with history, and its memory flat.

Two staging stores hold one sink with 100 and with 10,000 COMMITTED epochs
(seeded in bulk like metric 3, with the sink's running totals set as the
ledger would have left them). Each gets its own exporter, run as users run
it: ``twophase metrics serve`` in a process of its own. The bench then
scrapes both over HTTP, interleaved, ``SCRAPES`` times each (a new
connection per scrape, as Prometheus may), and reads each exporter's
resident memory from ``/proc`` along the way. Targets: a scrape of the
10,000-epoch store under 50 ms (its 95th percentile), and the exporter's
memory flat (under 1 MiB of growth from scrape 100 to the last).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.context import TP_INFLUX, Context
from bench.history import SINK, seed_history
from bench.stats import Summary, entry, interleaved
from twophase.store.database import Database

SCRAPES = 1000
SCRAPE_TARGET_MS = 50.0
FLAT_RSS_KIB = 1024
RSS_AT = (1, 10, 100, 500, SCRAPES)
_TOTALS = (
    "UPDATE twophase_sinks SET epochs_committed = %(n)s, points_staged = %(n)s::bigint * %(p)s,"
    " points_delivered = %(n)s::bigint * %(p)s, promote_attempts = %(n)s,"
    " last_committed_at = now() - interval '1 hour' WHERE sink_id = %(sink)s"
)
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def measure_scrape(ctx: Context) -> dict[str, Any]:
    small, large = ctx.plan.history
    with _exporter(ctx, small) as a, _exporter(ctx, large) as b:
        ctx.log(f"scrape: {SCRAPES} scrapes of each exporter, interleaved")
        rss: dict[str, dict[int, int]] = {"a": {}, "b": {}}
        times_a, times_b = interleaved(SCRAPES, _timed(a, rss["a"]), _timed(b, rss["b"]))
        read_ms = _store_read_ms(b)
    p95 = _percentile(times_b, 95)
    growth = rss["b"][SCRAPES] - rss["b"][100]
    ratio = Summary.of(times_b).median / Summary.of(times_a).median
    return entry(
        "ms per scrape",
        {f"{small}_epochs": Summary.of(times_a), f"{large}_epochs": Summary.of(times_b)},
        ratio,
        f"{large} / {small} committed epochs (medians)",
        f"p95 < {SCRAPE_TARGET_MS:g} ms at {large:,} epochs; RSS flat (< 1 MiB growth)",
        p95 < SCRAPE_TARGET_MS and growth < FLAT_RSS_KIB,
        p95_ms={f"{small}_epochs": _percentile(times_a, 95), f"{large}_epochs": p95},
        rss_kib={f"{small}_epochs": rss["a"], f"{large}_epochs": rss["b"]},
        rss_growth_kib_100_to_last=growth,
        store_read_ms_reported=read_ms,
        scrapes=SCRAPES,
    )


@contextmanager
def _exporter(ctx: Context, epochs: int) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A seeded store and ``twophase metrics serve`` over it: (process, port)."""
    config = ctx.scratch.config(f"scrape{epochs}", TP_INFLUX)
    with Database(config.staging) as db:
        seed_history(db, epochs, ctx.plan.history_points)
        with db.transaction() as cur:
            cur.execute(_TOTALS, {"n": epochs, "p": ctx.plan.history_points, "sink": SINK})
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TWOPHASE_")}
    env["TWOPHASE_STAGING_URL"] = config.staging.url.reveal()
    env["TWOPHASE_EXPORTER_CACHE"] = "0s"  # every scrape reads the store: what is measured
    script = Path(sys.executable).with_name("twophase")
    args = [str(script), "metrics", "serve", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(args, env=env, stderr=subprocess.DEVNULL)
    try:
        _wait_ready(proc, port)
        yield proc, port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _timed(exporter: tuple[subprocess.Popen[bytes], int], rss: dict[int, int]) -> Any:
    proc, port = exporter

    def run(repeat: int) -> float:
        started = time.perf_counter()
        _scrape(port)
        took = (time.perf_counter() - started) * 1000
        if repeat + 1 in RSS_AT:
            rss[repeat + 1] = _rss_kib(proc.pid)
        return took

    return run


def _scrape(port: int) -> str:
    with _OPENER.open(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return str(answer.read().decode())


def _store_read_ms(exporter: tuple[subprocess.Popen[bytes], int]) -> float:
    """What the exporter itself reports for its last read of the store."""
    for line in _scrape(exporter[1]).splitlines():
        if line.startswith("twophase_scrape_duration_seconds "):
            return round(float(line.split()[1]) * 1000, 3)
    raise RuntimeError("the exporter reported no twophase_scrape_duration_seconds")


def _wait_ready(proc: subprocess.Popen[bytes], port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"twophase metrics serve exited with {proc.returncode}")
        try:
            if "twophase_store_up 1.0" in _scrape(port):
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the exporter on port {port} did not answer within {timeout:g}s")


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


def _percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))], 3)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
