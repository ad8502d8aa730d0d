"""``python -m bench staging_scale``: what one PostgreSQL takes as the staging store.

1. **COPY rate**: N processes (1, 2, 4) each stage one write of P points through
   ``twophase.protocol.stage.stager.Stager`` at once, as N executors' tasks of one epoch
   would, into one staging database. Total points/s and line-protocol MB/s from
   the first start to the last end, and the CPU seconds per million points of the
   stagers and of their PostgreSQL backends (the server's share is what one
   PostgreSQL has to give, wherever the executors run). Each process builds its
   lines and opens its connection before the start. Per compression where the
   code has the setting (``gzip`` and ``none``), else the one way it stages.
2. **GC at many retained points** (:mod:`bench.gc_scale`): today's ``DELETE`` of
   every epoch's chunks, against dropping the partitions of a table partitioned by
   epoch that holds the same rows; half, then the rest.

The quick plan is small (20k points per process; 200k retained points); the full
plan stages 100k points per process and retains 10M points (100 epochs of 100k:
about two minutes of filling here, mostly PostgreSQL). ``--json FILE`` writes the
results there (else ``bench/results/staging_scale-<stamp>.json``); a summary is
printed. As metric ``staging_scale`` of ``python -m bench``, the plan picks the size.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from bench.blackhole import Blackhole
from bench.context import Context
from bench.cpu import backend_pids
from bench.gc_scale import GcPlan, measure_gc, wal_lsn, wal_since
from bench.lines import epoch_lines
from bench.plan import QUICK
from bench.relay import TODAY, compressions
from bench.report import RESULTS, checkout, command, finish, machine, stamp, write_json
from bench.servers import REPO, Scratch, Servers, admin_conninfo, scratch
from bench.stats import Summary, entry
from bench.taskcpu import tasks_cpu_s
from twophase.config import StagingConfig, load_staging_config
from twophase.protocol.stage.stager import Stager
from twophase.store.database import Database

COPY_ROLE = "scale_copy"
COPY_SINK = "scale-copy"
_MILLION = 1_000_000


@dataclass(frozen=True)
class ScalePlan:
    """Points per staging process, process counts, repeats per count; the GC's size."""

    points: int
    processes: tuple[int, ...]
    repeats: int
    gc: GcPlan


PLANS = {
    "quick": ScalePlan(20_000, (1, 2), 1, GcPlan(epochs=20, points=10_000)),
    "full": ScalePlan(100_000, (1, 2, 4), 3, GcPlan(epochs=100, points=100_000)),
}


def with_compression(config: StagingConfig, compression: str) -> StagingConfig:
    if compression == TODAY:
        return config
    changes: dict[str, Any] = {"compression": compression}  # a field of newer code only
    return dataclasses.replace(config, **changes)


def child(url: str, points: int, seed: int, compression: str) -> None:
    """One staging process: build the lines, connect, say ready; on ``go`` stage them as
    one write and print its times; on ``exit`` (once the parent has read its
    backend's CPU) leave."""
    config = with_compression(load_staging_config(env={}, staging_url=url), compression)
    lines = epoch_lines(points, seed)
    with Database(config) as db:
        stager = Stager(db, config)
        stager.stage(COPY_SINK, -1, lines[:10])  # the connection is open before the start
        print(json.dumps({"ready": True}), flush=True)
        sys.stdin.readline()
        cpu, started = time.process_time(), time.time()
        stager.stage(COPY_SINK, seed, lines, partition_id=seed)
        ended, cpu = time.time(), time.process_time() - cpu
        lp = sum(map(len, lines)) + len(lines)
        print(
            json.dumps({"start": started, "end": ended, "cpu_s": cpu, "lp_bytes": lp}), flush=True
        )
        sys.stdin.readline()


def _spawn(url: str, points: int, seed: int, compression: str) -> subprocess.Popen[str]:
    spec = [url, str(points), str(seed), compression]
    return subprocess.Popen(
        [sys.executable, "-m", "bench.staging_scale", "--child", *spec],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _say(proc: subprocess.Popen[str], word: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(word + "\n")
    proc.stdin.flush()


def _hear(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    text = proc.stdout.readline()
    if not text:
        raise RuntimeError(f"staging process {proc.pid} ended early ({proc.wait()})")
    answer: dict[str, Any] = json.loads(text)
    return answer


class CopyRound:
    """N staging processes started together; the span from first start to last end."""

    def __init__(self, made: Scratch, compression: str) -> None:
        self._url = made.staging_url(COPY_ROLE)
        self._conninfo = admin_conninfo(made.servers.staging_url)
        self._database = f"{made.prefix}_{COPY_ROLE}"
        self._compression = compression
        self._seed = 0

    def run(self, processes: int, points: int) -> dict[str, float]:
        procs = []
        try:
            for _ in range(processes):
                self._seed += 1
                procs.append(_spawn(self._url, points, self._seed, self._compression))
            return self._timed(procs, points)
        finally:
            for proc in procs:  # a failed round leaves no process behind
                if proc.poll() is None:
                    proc.kill()
                proc.wait()

    def _timed(self, procs: Sequence[subprocess.Popen[str]], points: int) -> dict[str, float]:
        for proc in procs:
            _hear(proc)  # ready
        backends = backend_pids(self._conninfo, self._database)
        with psycopg.connect(self._conninfo, autocommit=True) as admin:
            lsn, server = wal_lsn(admin), tasks_cpu_s(backends)
            for proc in procs:
                _say(proc, "go")
            done = [_hear(proc) for proc in procs]
            server = tasks_cpu_s(backends) - server
            wal = wal_since(admin, lsn)
        for proc in procs:
            _say(proc, "exit")
            proc.wait(timeout=30)
        span = max(d["end"] for d in done) - min(d["start"] for d in done)
        total = points * len(procs)
        return {
            "processes": len(procs),
            "points_per_s": total / span,
            "mb_per_s": sum(d["lp_bytes"] for d in done) / span / 1e6,
            "span_s": span,
            "stager_cpu_s_per_m": sum(d["cpu_s"] for d in done) / total * _MILLION,
            "postgres_cpu_s_per_m": server / total * _MILLION,
            "wal_bytes_per_point": wal / total,  # server-wide: others' writes too
        }


def measure_copy(
    made: Scratch, plan: ScalePlan, log: Callable[[str], None]
) -> dict[str, dict[str, list[dict[str, float]]]]:
    """Per compression and process count, one sample per repeat (the counts rotating)."""
    out: dict[str, dict[str, list[dict[str, float]]]] = {}
    for compression in compressions():
        rounds = CopyRound(made, compression)
        samples: dict[str, list[dict[str, float]]] = {str(n): [] for n in plan.processes}
        for repeat in range(plan.repeats):
            shift = repeat % len(plan.processes)
            for n in (*plan.processes[shift:], *plan.processes[:shift]):
                log(f"staging_scale copy: {compression}, {n} x {plan.points:,} points")
                samples[str(n)].append(rounds.run(n, plan.points))
        out[compression] = samples
    return out


def measure(made: Scratch, plan: ScalePlan, log: Callable[[str], None]) -> dict[str, Any]:
    copy = measure_copy(made, plan, log)
    with Blackhole() as hole:
        gc = measure_gc(made, hole, plan.gc, made.staging("scale_gc"), log)
    return {"plan": dataclasses.asdict(plan), "copy": copy, "gc": gc}


def copy_figures(copy: dict[str, dict[str, list[dict[str, float]]]]) -> dict[str, Any]:
    """Medians per compression and process count."""
    return {
        compression: {
            n: {key: round(statistics.median(s[key] for s in samples), 3) for key in samples[0]}
            for n, samples in by_count.items()
        }
        for compression, by_count in copy.items()
    }


def measure_staging_scale(ctx: Context) -> dict[str, Any]:
    """Metric ``staging_scale``: COPY rate by staging processes, GC cost by retained points."""
    raw = measure(ctx.scratch, PLANS.get(ctx.plan.name, PLANS["quick"]), ctx.log)
    return as_entry(raw)


def as_entry(raw: dict[str, Any]) -> dict[str, Any]:
    """Rows: N processes' total points/s against one process's; DELETE against DROP."""
    parts: dict[str, Any] = {}
    for compression, by_count in raw["copy"].items():
        one = [s["points_per_s"] for s in by_count["1"]]
        for n, samples in by_count.items():
            if n != "1":
                parts[f"COPY {compression}, {n} processes"] = _pair(
                    "points/s", (f"{n} processes", [s["points_per_s"] for s in samples]), ("1", one)
                )
    gc = raw["gc"]
    for what, delete, dropped in (
        ("half", "delete_half", "detach_drop_half"),
        ("rest", "delete_rest", "drop_rest"),
    ):
        parts[f"GC of {gc['points']:,} retained points, {what}"] = _pair(
            "s", ("DELETE", [gc[delete]["wall_s"]]), ("DROP partitions", [gc[dropped]["wall_s"]])
        )
    return {"parts": parts, "holds": None, "copy": copy_figures(raw["copy"]), "raw": raw}


def _pair(
    unit: str, a: tuple[str, Sequence[float]], b: tuple[str, Sequence[float]]
) -> dict[str, Any]:
    ratio = statistics.median(a[1]) / max(statistics.median(b[1]), 1e-9)
    sides = {a[0]: Summary.of(a[1]), b[0]: Summary.of(b[1])}
    return entry(unit, sides, ratio, f"{a[0]} / {b[0]} (medians)", "reported", None)


def summary_lines(raw: dict[str, Any]) -> Iterator[str]:
    for compression, by_count in copy_figures(raw["copy"]).items():
        for n, f in by_count.items():
            yield (
                f"COPY {compression}, {n} processes: {f['points_per_s']:,.0f} points/s, "
                f"{f['mb_per_s']:.1f} MB/s; CPU s per M points: stagers "
                f"{f['stager_cpu_s_per_m']:.3f}, postgres {f['postgres_cpu_s_per_m']:.3f}"
            )
    gc = raw["gc"]
    yield f"GC of {gc['points']:,} points in {gc['epochs']} epochs (filled in {gc['fill_s']} s):"
    for key in ("delete_half", "delete_rest", "vacuum", "detach_drop_half", "drop_rest"):
        yield f"  {key}: {gc[key]}"
    yield f"  partitioned copy: {gc['partitioned_copy']}; bytes: {gc['bytes']}"


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    ap = argparse.ArgumentParser(prog="python -m bench staging_scale", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="the small plan")
    ap.add_argument("--json", type=Path, help="results file")
    parsed = ap.parse_args(args)
    plan = PLANS["quick" if parsed.quick else "full"]
    started, clock = stamp(), time.monotonic()
    results: dict[str, Any] = {
        "started": started,
        **checkout(),
        "command": command("staging_scale", args),
        "machine": machine(),
    }
    with scratch(Servers.from_env()) as made:
        raw = measure(made, plan, Context(QUICK, made).log)
    results.update(seconds=round(time.monotonic() - clock, 1), copy=copy_figures(raw["copy"]))
    results["raw"] = raw
    path = write_json(results, parsed.json or RESULTS / f"staging_scale-{started}.json")
    return finish("\n".join(summary_lines(raw)), {"json": path})


if __name__ == "__main__":  # one staging process of the COPY measure (measure())
    child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
