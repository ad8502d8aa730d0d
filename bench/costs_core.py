"""``bench.costs``'s parts without Spark: staging CPU (row builder against columnar, on
the CSV pipeline's Arrow batches), one epoch step by step, and the other metrics'
machinery run at the sizes ``bench.costs`` asks for (relay, slow link, fan-out with
stub and with real servers, loopback throughput)."""

from __future__ import annotations

import dataclasses
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv

from bench import fanout, relay, roundtrip, steps, throughput
from bench.blackhole import Blackhole
from bench.context import Context
from bench.costs_job import COLUMNS, MEASUREMENT, TAGS, TIME
from bench.costs_spark import csv_line
from bench.cpu import backend_pids
from bench.encode import by_rows, columnar
from bench.fanout_parts import Influxes, addresses, influx_servers
from bench.servers import admin_conninfo
from bench.stats import compared, rotated
from bench.taskcpu import tasks_cpu_s
from twophase.config import InfluxDBSettings, TargetConfig
from twophase.points.builder import PointSpec

SPEC = PointSpec(MEASUREMENT, TAGS, None, TIME, "ms")
ARROW_BATCH = 10_000  # spark.sql.execution.arrow.maxRecordsPerBatch's default
WAYS: dict[str, Callable[[PointSpec, pa.RecordBatch], list[Any]]] = {
    "rows": by_rows,
    "columnar": columnar,
}
SINK = "bench-costs-staging"


def csv_batches(rows: int) -> list[pa.RecordBatch]:
    """The CSV pipeline's rows as the Arrow batches a staging task gets from Spark."""
    text = "".join([",".join(COLUMNS) + "\n", *(csv_line(i) for i in range(rows))]).encode()
    types = {"time": pa.int64(), "cpu": pa.float64(), "mem": pa.int64(), "requests": pa.int64()}
    options = pacsv.ConvertOptions(column_types=types)
    table = pacsv.read_csv(pa.BufferReader(text), convert_options=options)
    batches: list[pa.RecordBatch] = table.combine_chunks().to_batches(ARROW_BATCH)
    return batches


def measure_staging(ctx: Context, rows: int, repeats: int) -> dict[str, Any]:
    """CPU seconds per million points of a staging task, both encoders, alternating:
    encoding, then ``Stager.stage`` (compress, COPY) in this process, and the staging
    backends' CPU over the COPY."""
    tp = ctx.tp()
    tp.begin_run(SINK, uuid.uuid4().hex, "costs")
    batches = csv_batches(rows)
    conninfo = admin_conninfo(ctx.scratch.servers.staging_url)
    samples: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    epoch = 0
    for repeat in range(repeats):
        for way in list(WAYS) if repeat % 2 == 0 else list(reversed(WAYS)):
            backends = backend_pids(conninfo, ctx.scratch.prefix)
            started, pg = time.process_time(), tasks_cpu_s(backends)
            items = [item for batch in batches for item in WAYS[way](SPEC, batch)]
            encoded = time.process_time()
            tp.stager.stage(SINK, epoch, items)
            staged = time.process_time()
            epoch += 1
            pg_after = tasks_cpu_s(backend_pids(conninfo, ctx.scratch.prefix))
            samples[way].append(
                {"encode": encoded - started, "stage": staged - encoded, "postgres": pg_after - pg}
            )
    return {"rows": rows, "repeats": repeats, "per_million": _per_million(samples, rows)}


def _per_million(samples: dict[str, list[dict[str, float]]], rows: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for way, runs in samples.items():
        parts = {k: statistics.median(r[k] for r in runs) / rows * 1e6 for k in runs[0]}
        totals = [(r["encode"] + r["stage"]) / rows * 1e6 for r in runs]
        out[way] = {**{k: round(v, 3) for k, v in parts.items()}, "executor": totals}
    return out


def measure_steps(ctx: Context, points: int, repeats: int) -> dict[str, Any]:
    """``bench.steps``: one epoch's steps (stage, decide, read, promote; direct's send)."""
    spans = [steps.one_epoch(ctx, points, 2, 1000 + r) for r in range(repeats)]
    keys = [k for k in spans[0] if k != "chunks"]
    return {
        "points": points,
        "writes": 2,
        "repeats": repeats,
        "ms": {k: round(statistics.median(s[k] for s in spans) * 1000, 1) for k in keys},
    }


def measure_relay(ctx: Context, points: int, repeats: int) -> dict[str, Any]:
    raw = relay.measure(ctx.scratch, points, repeats, ctx.log)
    per = relay.figures(raw)
    return {
        name: {
            "driver_cpu_s_per_m": figures["driver_cpu_s_per_m"],
            "postgres_cpu_s_per_m": figures["postgres_cpu_s_per_m"],
            "influxd_cpu_s_per_m": figures["influxd_cpu_s_per_m"],
            "stage_cpu_s_per_m": figures["stage_cpu_s_per_m"],
            "influx_points_per_s": figures["influx_points_per_s"],
        }
        for name, figures in per.items()
    } | {"points": points, "repeats": repeats}


def measure_roundtrip(ctx: Context, plan: tuple[int, int, int]) -> dict[str, Any]:
    sized = Context(dataclasses.replace(ctx.plan, roundtrip=plan), ctx.scratch, ctx.seeds)
    try:
        return roundtrip.measure_roundtrip(sized)
    finally:
        sized.close()


def measure_throughput(ctx: Context, sizes: tuple[tuple[int, int], ...]) -> dict[str, Any]:
    sized = Context(dataclasses.replace(ctx.plan, throughput=sizes), ctx.scratch, ctx.seeds)
    try:
        return throughput.measure_throughput(sized)
    finally:
        sized.close()


def _stub_influxes(ctx: Context, a: Blackhole, b: Blackhole) -> Influxes:
    def make(url: str, name: str) -> TargetConfig:
        return TargetConfig(
            url=url,
            influxdb=InfluxDBSettings(api="v1", database=f"{ctx.scratch.prefix}_stub_{name}"),
        )

    return Influxes((a.url, b.url), make, (a.pid, b.pid))


def measure_fanout_stub(ctx: Context, epochs: int, delay_s: float = 0.020) -> dict[str, Any]:
    """Two targets against one, every target a stub server that only answers (204, the
    body dropped) behind a proxy holding each answer ``delay_s``: what the client pays
    for the second target. Commits rotate; ``bench.fanout``'s sinks and CPU meter."""
    with Blackhole() as a, Blackhole() as b:
        run = fanout.Run(ctx.scratch, _stub_influxes(ctx, a, b), fanout.QUICK, ctx.log, ctx.seeds)
        with (
            addresses(run.influxes.urls, run.influxes.make, delay_s) as at,
            fanout._bench(run, "stub", at) as bench,
        ):
            got: dict[str, list[float]] = {"two": [], "one": []}
            sinks = {"one": bench.one, "two": bench.two}
            ctx.log(f"costs fan-out, stub servers: {epochs} epochs per sink")
            rotated(epochs, {name: _rate(sinks[name], got[name]) for name in got})
            cpu = bench.meter.medians()
    pair = (("two targets", got["two"]), ("one target", got["one"]))
    return {**compared("points/s", pair, 0.95), "cpu_s_per_epoch": cpu}


def _rate(sink: Any, into: list[float]) -> Callable[[int], float]:
    def one(_: int) -> float:
        into.append(fanout.POINTS / sink.commit())
        return into[-1]

    return one


def measure_fanout_real(ctx: Context, plan: fanout.Plan) -> dict[str, Any]:
    """``bench.fanout``'s loopback setting (two influxd of the run's own), this plan."""
    with influx_servers(ctx.scratch, False) as influxes:
        run = fanout.Run(ctx.scratch, influxes, plan, ctx.log, ctx.seeds)
        return fanout._setting(run, "loopback", 0.0)


def sizes_label(sizes: Sequence[tuple[int, int]]) -> str:
    return ", ".join(f"{size:,} x {n}" for size, n in sizes)
