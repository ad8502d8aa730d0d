"""``python -m bench relay``: what relaying staged points from PostgreSQL to InfluxDB costs
the driver, per staging compression.

Promotion runs in one process, the driver's; this measures how far that one
process goes. For each compression of the staged chunks (``compression``
``gzip`` and ``none``; code without the setting has one way, labelled
``today``), each in a staging database of its own:

1. **Driver CPU**: the promoting process's CPU seconds (``time.process_time``: all
   its threads: the caller, the read-ahead and the lanes) per million points over
   ``Committer.commit`` (recover, decide, promote, mark) of one epoch staged
   beforehand. Staging is the executors' work: timed apart, never in this
   figure. Against the dev InfluxDB, whose CPU (and the staging backends') over
   the same span is beside it.
2. **Relay rate**: the same commit with InfluxDB replaced by :mod:`bench.blackhole`
   (a child process that reads each body to its end and answers 204): body MB/s
   as sent on the wire and points/s, with the default lanes; and with two targets
   (both the blackhole), for what each more target costs. The blackhole alone,
   flooded by a raw-socket client, shows it is not the bound.
3. **Staged bytes per point**: the chunk rows' columns as PostgreSQL stores them
   (``pg_column_size``: compressed, inline or TOASTed) over their points; and the
   chunks table with its TOAST and indexes (``pg_total_relation_size``) over all
   the points its database holds.

Each repeat commits one fresh epoch per compression and destination, the
compressions' order rotating. ``--json FILE`` writes the results there
(with the commit, the date and the command), else to
``bench/results/relay-<stamp>.json``; a summary is printed. As metric
``relay`` of ``python -m bench``, the plan picks the size.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gzip
import json
import os
import statistics
import time
import urllib.parse
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psycopg import sql

from bench.blackhole import Blackhole, flood
from bench.context import Context
from bench.cpu import backend_pids, influxd_pid, process_cpu_s
from bench.fanout_cpu import machine_busy_s
from bench.lines import Seeds, epoch_lines
from bench.plan import QUICK
from bench.report import RESULTS, checkout, command, finish, machine, stamp, write_json
from bench.servers import Scratch, Servers, admin_conninfo, scratch
from bench.stats import Summary, entry
from bench.taskcpu import tasks_cpu_s
from twophase.config import (
    InfluxDBSettings,
    NamedTarget,
    StagingConfig,
    TargetConfig,
    TwoPhaseConfig,
)
from twophase.model import CommitMessage, EpochState, Lease
from twophase.protocol.commit.runtime import TwoPhase

TODAY = "today"  # the one way there is, on code without the compression setting
SIZES = {"quick": (100_000, 1), "full": (1_000_000, 3)}  # plan -> (points per epoch, repeats)
WARMUP_POINTS = 10_000
FLOOD_S = 2.0
DESTINATIONS = ("influx", "blackhole", "two_targets")
_MILLION = 1_000_000


class RelayError(RuntimeError):
    """A measured commit did not deliver its epoch."""


def compressions() -> tuple[str, ...]:
    """The compressions this code offers: gzip and none, or only today's way."""
    names = {f.name for f in dataclasses.fields(StagingConfig)}
    return ("gzip", "none") if "compression" in names else (TODAY,)


def staging_config(made: Scratch, compression: str) -> StagingConfig:
    """A staging database of the compression's own, automatic GC off (no thread may
    spend this process's CPU inside a measured commit)."""
    config = dataclasses.replace(made.staging(f"relay_{compression}"), gc_interval_s=0.0)
    if compression != TODAY:
        # by name: code without the setting has no such field (and never gets here)
        changes: dict[str, Any] = {"compression": compression}
        config = dataclasses.replace(config, **changes)
    return config


@dataclass
class Route:
    """One sink promoting one compression's epochs to one destination."""

    tp: TwoPhase
    sink_id: str
    lease: Lease
    epoch: int = 0

    @classmethod
    def open(cls, staging: StagingConfig, influx: TargetConfig, sink_id: str) -> Route:
        tp = TwoPhase.open(TwoPhaseConfig(staging, influx))
        return cls(tp, sink_id, tp.begin_run(sink_id, uuid.uuid4().hex, "bench-relay"))

    def stage(self, lines: Sequence[str]) -> tuple[int, CommitMessage, dict[str, float]]:
        """Stage the next epoch (the executors' work): its number, message and cost."""
        epoch, self.epoch = self.epoch, self.epoch + 1
        cpu, wall = time.process_time(), time.perf_counter()
        message = self.tp.stager.stage(self.sink_id, epoch, lines)
        cost = {"stage_s": time.perf_counter() - wall, "stage_cpu_s": time.process_time() - cpu}
        return epoch, message, cost

    def commit(self, epoch: int, message: CommitMessage, points: int) -> None:
        outcome = self.tp.committer.commit(self.lease, epoch, [message])
        delivered = outcome.promoted.delivered if outcome.promoted else 0
        if outcome.state != EpochState.COMMITTED or delivered != points:
            raise RelayError(f"{self.sink_id} epoch {epoch}: {outcome.state}, {delivered}/{points}")

    def close(self) -> None:
        self.tp.close()


def listening_pid(port: int) -> int | None:
    """The process listening on a local TCP port (its socket's inode among its fds), or
    None. The dev influxd is found this way from any checkout, a worktree's too."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as handle:
            for row in list(handle)[1:]:
                fields = row.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and inodes & _fd_links(proc):
            return int(proc.name)
    return None


def _fd_links(proc: Path) -> set[str]:
    try:
        return {os.readlink(fd) for fd in (proc / "fd").iterdir()}
    except OSError:  # gone, or not ours to read
        return set()


def influx_pid(url: str) -> int | None:
    """The InfluxDB server at ``url`` when it runs here, else the dev one, else None."""
    port = urllib.parse.urlsplit(url).port
    return (listening_pid(port) if port else None) or influxd_pid()


class Probe:
    """CPU seconds of this process, the staging backends of one database, influxd and
    the blackhole, and the blackhole's counts, sampled around a commit."""

    def __init__(self, made: Scratch, database: str, hole: Blackhole) -> None:
        self._conninfo = admin_conninfo(made.servers.staging_url)
        self._database, self._hole = database, hole
        self._influxd = influx_pid(made.servers.influx_url)

    def sample(self, backends: Sequence[int]) -> dict[str, float]:
        hole = self._hole.stats()  # first: its own request is not in the client's time
        return {
            "wall_s": time.perf_counter(),
            "client_cpu_s": time.process_time(),
            "postgres_cpu_s": tasks_cpu_s(backends),
            "influxd_cpu_s": process_cpu_s(self._influxd) if self._influxd else 0.0,
            "machine_cpu_s": machine_busy_s(),  # every process: how busy the cores were
            "blackhole_cpu_s": hole["cpu_s"],
            "wire_bytes": hole["bytes"],
            "requests": hole["requests"],
            "gzip_requests": hole["gzip"],
        }

    def backends(self) -> list[int]:
        return backend_pids(self._conninfo, self._database)


def timed_commit(route: Route, lines: Sequence[str], probe: Probe) -> dict[str, Any]:
    """Stage an epoch off the clock, then sample around its commit."""
    epoch, message, cost = route.stage(lines)
    stored = staged_bytes(route.tp, message.write_id)
    backends = probe.backends()
    before = probe.sample(backends)
    route.commit(epoch, message, len(lines))
    after = probe.sample(backends)
    spent = {k: after[k] - before[k] for k in before}
    return {**spent, **cost, "points": len(lines), "stored": stored}


def staged_bytes(tp: TwoPhase, write_id: str) -> dict[str, int]:
    """Per column of the chunks table, the bytes the write's rows take as stored
    (``pg_column_size``: after compression, TOASTed or inline), and its row count."""
    with tp.db.transaction() as cur:
        cur.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_name = 'twophase_staged_chunks' ORDER BY ordinal_position"
        )
        columns = [str(row[0]) for row in cur.fetchall()]
        sums = sql.SQL(", ").join(
            sql.SQL("COALESCE(sum(pg_column_size({})), 0)").format(sql.Identifier(c))
            for c in columns
        )
        query = sql.SQL("SELECT count(*), {} FROM twophase_staged_chunks WHERE write_id = %s")
        cur.execute(query.format(sums), (uuid.UUID(write_id),))
        row = cur.fetchone()
    assert row is not None
    return {"rows": int(row[0]), **{c: int(v) for c, v in zip(columns, row[1:], strict=True)}}


def table_bytes(tp: TwoPhase) -> dict[str, int]:
    """The chunks table's size on disk (heap, TOAST, indexes) and the points it holds."""
    with tp.db.transaction() as cur:
        cur.execute(
            "SELECT pg_total_relation_size(c.oid), pg_relation_size(c.oid),"
            " COALESCE(pg_total_relation_size(NULLIF(c.reltoastrelid, 0)), 0),"
            " pg_indexes_size(c.oid), (SELECT COALESCE(sum(points), 0)"
            " FROM twophase_staged_chunks) FROM pg_class c WHERE c.relname = %s",
            ("twophase_staged_chunks",),
        )
        row = cur.fetchone()
    assert row is not None
    keys = ("total", "heap", "toast", "indexes", "points")
    return {k: int(v) for k, v in zip(keys, row, strict=True)}


class Compression:
    """One compression's routes (InfluxDB, the blackhole, two blackhole targets) over
    a staging database of its own, and their samples."""

    def __init__(self, made: Scratch, name: str, hole: Blackhole, stack: ExitStack) -> None:
        self.name = name
        staging = staging_config(made, name)
        sink = TargetConfig(url=hole.url, influxdb=InfluxDBSettings(api="v1", database="blackhole"))
        two = dataclasses.replace(
            sink,
            targets=(
                NamedTarget(
                    "a",
                    sink.with_fields(database="a"),
                ),
                NamedTarget(
                    "b",
                    sink.with_fields(database="b"),
                ),
            ),
        )
        configs = {"influx": made.influx(f"relay_{name}"), "blackhole": sink, "two_targets": two}
        self.routes = {}
        for destination in DESTINATIONS:
            route = Route.open(staging, configs[destination], f"relay-{destination}")
            stack.callback(route.close)
            self.routes[destination] = route
        self.probe = Probe(made, f"{made.prefix}_relay_{name}", hole)
        self.samples: dict[str, list[dict[str, Any]]] = {d: [] for d in DESTINATIONS}

    def warm_up(self, lines: Sequence[str]) -> None:
        """One untimed epoch per route: connections, InfluxDB's series, caches."""
        for route in self.routes.values():
            epoch, message, _ = route.stage(lines)
            route.commit(epoch, message, len(lines))

    def run(self, lines: Sequence[str]) -> None:
        for destination, route in self.routes.items():
            self.samples[destination].append(timed_commit(route, lines, self.probe))

    def table(self) -> dict[str, int]:
        return table_bytes(self.routes["influx"].tp)


def rotations(names: Sequence[str], repeat: int) -> list[str]:
    shift = repeat % len(names)
    return [*names[shift:], *names[:shift]]


def flood_alone(hole: Blackhole, lines: Sequence[str], points: int) -> dict[str, Any]:
    """The blackhole taking one request-sized body (``points`` lines) over 4 connections,
    as text and gzip-compressed."""
    body = "\n".join(lines[:points]).encode()
    return {
        "text": flood(hole, body, 4, FLOOD_S),
        "gzip": flood(hole, gzip.compress(body, 6), 4, FLOOD_S, gzip=True),
    }


def measure(made: Scratch, points: int, repeats: int, log: Any = print) -> dict[str, Any]:
    """Every compression's samples, the tables' sizes and the blackhole alone."""
    seeds = Seeds()
    with ExitStack() as stack:
        hole = stack.enter_context(Blackhole())
        runs = {name: Compression(made, name, hole, stack) for name in compressions()}
        warm = epoch_lines(WARMUP_POINTS, seeds.take())
        for compression in runs.values():
            compression.warm_up(warm)
        lp_bytes = 0.0
        for repeat in range(repeats):
            lines = epoch_lines(points, seeds.take())
            lp_bytes = sum(map(len, lines)) / len(lines) + 1  # each line and its newline
            for name in rotations(list(runs), repeat):
                log(f"relay: repeat {repeat + 1}/{repeats}, {name}, {points:,} points")
                runs[name].run(lines)
        alone = flood_alone(hole, lines, 5_000)
        return {
            "points": points,
            "repeats": repeats,
            "line_protocol_bytes_per_point": round(lp_bytes, 2),
            "blackhole_alone": alone,
            "compressions": {
                name: {"samples": run.samples, "table": run.table()} for name, run in runs.items()
            },
        }


def _per_million(samples: Sequence[dict[str, Any]], key: str) -> list[float]:
    return [s[key] / s["points"] * _MILLION for s in samples]


def figures(raw: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per compression, medians (and min-max) of what the module's doc lists."""
    out = {}
    for name, run in raw["compressions"].items():
        influx, hole, two = (run["samples"][d] for d in DESTINATIONS)
        table = run["table"]
        out[name] = {
            "driver_cpu_s_per_m": Summary.of(_per_million(influx, "client_cpu_s")).as_dict(),
            "influxd_cpu_s_per_m": Summary.of(_per_million(influx, "influxd_cpu_s")).as_dict(),
            "postgres_cpu_s_per_m": Summary.of(_per_million(influx, "postgres_cpu_s")).as_dict(),
            "influx_points_per_s": Summary.of(_rates(influx, "points")).as_dict(0),
            "influx_busy_cores": Summary.of(_rates(influx, "machine_cpu_s")).as_dict(2),
            "relay": _relay(hole),
            "relay_two_targets": _relay(two),
            "stage_cpu_s_per_m": Summary.of(_per_million(influx, "stage_cpu_s")).as_dict(),
            "staged_bytes_per_point": _stored(influx),
            "table_bytes_per_point": round(table["total"] / max(table["points"], 1), 2),
            "table": table,
        }
    return out


def _rates(samples: Sequence[dict[str, Any]], key: str) -> list[float]:
    return [s[key] / s["wall_s"] for s in samples]


def _relay(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {
        "points_per_s": Summary.of(_rates(samples, "points")).as_dict(0),
        "wire_mb_per_s": Summary.of([r / 1e6 for r in _rates(samples, "wire_bytes")]).as_dict(),
        "driver_cpu_s_per_m": Summary.of(_per_million(samples, "client_cpu_s")).as_dict(),
        "postgres_cpu_s_per_m": Summary.of(_per_million(samples, "postgres_cpu_s")).as_dict(),
        "blackhole_cpu_s_per_m": Summary.of(_per_million(samples, "blackhole_cpu_s")).as_dict(),
        "wire_bytes_per_point": round(statistics.median(_per_point(samples, "wire_bytes")), 2),
        "busy_cores": Summary.of(_rates(samples, "machine_cpu_s")).as_dict(2),
        "requests": samples[0]["requests"],
        "gzip_requests": samples[0]["gzip_requests"],
    }


def _per_point(samples: Sequence[dict[str, Any]], key: str) -> list[float]:
    return [s[key] / s["points"] for s in samples]


def _stored(samples: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Bytes per point of each column as stored, and of the whole row."""
    stored = samples[0]["stored"]
    points = samples[0]["points"]
    columns = {k: round(v / points, 3) for k, v in stored.items() if k != "rows"}
    return {"all_columns": round(sum(columns.values()), 2), **columns, "rows": stored["rows"]}


def measure_relay(ctx: Context) -> dict[str, Any]:
    """Metric ``relay``: driver CPU, relay rate and staged bytes per compression."""
    points, repeats = SIZES.get(ctx.plan.name, SIZES["quick"])
    raw = measure(ctx.scratch, points, repeats, ctx.log)
    return as_entry(raw, figures(raw))


def as_entry(raw: dict[str, Any], per: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The metric's rows: each compression against a reference of the same run (driver
    CPU against influxd's, the relay against the blackhole alone, stored bytes against
    the line protocol's), and gzip against none where both exist."""
    parts: dict[str, Any] = {}
    lp = raw["line_protocol_bytes_per_point"]
    for name, run in raw["compressions"].items():
        influx, hole = run["samples"]["influx"], run["samples"]["blackhole"]
        alone = raw["blackhole_alone"]["gzip" if name == "gzip" else "text"]["mb_per_s"]
        stored = per[name]["staged_bytes_per_point"]["all_columns"]
        parts[f"{name}, driver CPU"] = _pair(
            "CPU s per M points",
            (name, _per_million(influx, "client_cpu_s")),
            ("influxd", _per_million(influx, "influxd_cpu_s")),
        )
        parts[f"{name}, relay to a blackhole"] = _pair(
            "MB/s",
            (name, [r / 1e6 for r in _rates(hole, "wire_bytes")]),
            ("blackhole alone", [alone]),
        )
        parts[f"{name}, relay points/s, two targets"] = _pair(
            "points/s",
            ("two targets", _rates(run["samples"]["two_targets"], "points")),
            ("one target", _rates(hole, "points")),
        )
        parts[f"{name}, staged bytes"] = _pair(
            "bytes/point", (name, [stored]), ("line protocol", [lp])
        )
    if {"gzip", "none"} <= set(raw["compressions"]):
        gz, plain = (raw["compressions"][n]["samples"] for n in ("gzip", "none"))
        parts["gzip / none, driver CPU"] = _pair(
            "CPU s per M points",
            ("gzip", _per_million(gz["influx"], "client_cpu_s")),
            ("none", _per_million(plain["influx"], "client_cpu_s")),
        )
        parts["gzip / none, relay points/s"] = _pair(
            "points/s",
            ("gzip", _rates(gz["blackhole"], "points")),
            ("none", _rates(plain["blackhole"], "points")),
        )
    return {"parts": parts, "holds": None, "figures": per, "raw": raw}


def _pair(
    unit: str, a: tuple[str, Sequence[float]], b: tuple[str, Sequence[float]]
) -> dict[str, Any]:
    ratio = statistics.median(a[1]) / statistics.median(b[1])
    sides = {a[0]: Summary.of(a[1]), b[0]: Summary.of(b[1])}
    return entry(unit, sides, ratio, f"{a[0]} / {b[0]} (medians)", "reported", None)


def summary_lines(per: dict[str, dict[str, Any]], alone: dict[str, Any]) -> Iterator[str]:
    for name, f in per.items():
        relay, two = f["relay"], f["relay_two_targets"]
        yield (
            f"{name}: driver CPU {f['driver_cpu_s_per_m']['median']:.3f} s/M points "
            f"(influxd {f['influxd_cpu_s_per_m']['median']:.3f}); relay "
            f"{relay['wire_mb_per_s']['median']:.1f} MB/s, "
            f"{relay['points_per_s']['median']:,.0f} points/s "
            f"(driver {relay['driver_cpu_s_per_m']['median']:.3f} CPU s/M, "
            f"{relay['busy_cores']['median']:.2f} cores busy), two targets "
            f"{two['points_per_s']['median']:,.0f} points/s; staged "
            f"{f['staged_bytes_per_point']['all_columns']:.1f} bytes/point "
            f"(table {f['table_bytes_per_point']:.1f})"
        )
    yield f"blackhole alone: {json.dumps(alone)}"


def main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench relay", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="one 100k-point epoch per route")
    ap.add_argument("--points", type=int, help="points per epoch (default: the plan's)")
    ap.add_argument("--repeats", type=int, help="epochs per route (default: the plan's)")
    ap.add_argument("--json", type=Path, help="results file (default: bench/results/relay-*)")
    args = ap.parse_args(argv)
    points, repeats = SIZES["quick" if args.quick else "full"]
    points, repeats = args.points or points, args.repeats or repeats
    started = stamp()
    results: dict[str, Any] = {
        "started": started,
        **checkout(),
        "command": command("relay", argv),
        "compressions": list(compressions()),
        "machine": machine(),
    }
    clock = time.monotonic()
    with scratch(Servers.from_env()) as made:
        ctx = Context(QUICK, made)
        raw = measure(made, points, repeats, ctx.log)
    results["seconds"] = round(time.monotonic() - clock, 1)
    per = figures(raw)
    results.update(figures=per, raw=raw)
    path = write_json(results, args.json or RESULTS / f"relay-{started}.json")
    return finish("\n".join(summary_lines(per, raw["blackhole_alone"])), {"json": path})
