"""``python -m bench fanout [--quick] [--out DIR] [--dev-server]``: two targets against one.

A sink with two InfluxDB targets (``targets``: a and b, ``min_targets = 1``)
against a sink with one, at 100k-point epochs, each epoch staged off the clock
and timed through ``Committer.commit`` (decide, promote, mark), in one run:

1. two caught-up targets against one: epoch wall time, as points/s;
2. b down (its address a proxy in ``cut`` mode): the first epoch leaves b
   lagging after ``target_deadline`` (that one-time cost is reported apart);
   then the epochs that go to a alone, against one target;
3. b back: ``CatchUp.run`` delivers b's backlog (the epochs of
   2) on the calling thread, points/s against one target's live commits.

Each repeat commits one epoch per sink (one target, two targets, b down), the
order rotating. 2 and 3 repeat once per outage: each outage's commits run in
parts of their own, closed before b catches up (as a driver gone away), so n
of the one-time cost and of the catch-up is the number of outages. Ratios are
of medians, with the median of each repeat's own ratio beside them (its
epochs ran back to back, under the same load from other work).

Two settings. "20 ms away": every target (the one-target sink's too) behind
a fault proxy of its own, in a process of its own (:mod:`bench.proxies`),
holding each answer 20 ms, as remote servers; the targets (>= 0.9x one target
for 1, 2 and 3) are set there. "loopback": no proxy but b's ``cut`` one,
reported. The CPU that each epoch took (this process, the proxies, the
influxd servers, the staging backends, the whole machine) is reported too
(:mod:`bench.fanout_cpu`): on two cores it says whether they were the bound.

Servers: two influxd of the run's own (``tests.support.start_own_influx``, in
temporary folders on the dev server's disk, with its configuration), a and
the one-target sink on the first, b on the second: two targets are two
servers, and their CPU is the run's alone (the dev server also takes other
work's writes). ``--dev-server`` puts every database on the dev InfluxDB.
PostgreSQL is the dev server, as beside a Spark driver. Writes
``fanout-<stamp>.json`` and ``.md`` under ``bench/results`` and prints them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import report
from bench.context import MAIN
from bench.fanout_cpu import Meter
from bench.fanout_parts import Addresses, Influxes, Sink, addresses, influx_servers, points_in
from bench.lines import Seeds
from bench.servers import Scratch, Servers, admin_conninfo, scratch
from bench.sides import BenchError
from bench.stats import compared
from twophase.config import StagingConfig, TargetConfig, TwoPhaseConfig
from twophase.protocol.commit.runtime import TwoPhase

POINTS = 100_000
ROUND_TRIP_S = 0.020
TARGET = 0.9
SETTINGS = {"20 ms away": ROUND_TRIP_S, "loopback": 0.0}  # name -> each answer's delay
FIRST = "b down: first epoch"
SINKS = ("one", "two", "down")  # one target; two; two, b going down
Log = Callable[[str], None]


@dataclass(frozen=True)
class Plan:
    """How much to measure (here the quick plan takes under 2 minutes, the full one 3-4.5)."""

    name: str
    cycles: int  # outages of b: n of the one-time cost and of the catch-up
    repeats: int  # epochs per sink and outage: n of 1 and 2 is cycles x repeats


QUICK = Plan("quick", cycles=2, repeats=3)
FULL = Plan("full", cycles=4, repeats=5)


@dataclass
class Figures:
    """One setting's raw figures: seconds per epoch by sink, points/s of each catch-up."""

    epochs: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in SINKS})
    first_down: list[float] = field(default_factory=list)
    catch_up: list[float] = field(default_factory=list)
    backlog: list[int] = field(default_factory=list)


@dataclass
class Bench:
    """One setting: its databases, its sinks, the parts of the outage's sink once b is
    back (which catch b up), the CPU meter, and the figures so far."""

    plan: Plan
    staging: StagingConfig
    where: Addresses
    one: Sink
    two: Sink
    down: Sink
    back: TwoPhase
    meter: Meter
    figures: Figures = field(default_factory=Figures)


@dataclass
class Run:
    """What every setting of the run shares."""

    made: Scratch
    influxes: Influxes
    plan: Plan
    log: Log
    seeds: Seeds = field(default_factory=Seeds)  # fresh points for every epoch of the run


def measure(run: Run) -> dict[str, Any]:
    return {name: _setting(run, name, delay) for name, delay in SETTINGS.items()}


def _setting(run: Run, name: str, delay: float) -> dict[str, Any]:
    tag = "rt" if delay else "lo"

    def make(url: str, database: str) -> TargetConfig:
        return run.influxes.make(url, f"{tag}_{database}")

    with addresses(run.influxes.urls, make, delay) as at, _bench(run, tag, at) as bench:
        for cycle in range(run.plan.cycles):
            run.log(f"{name}: outage {cycle + 1} of {run.plan.cycles}")
            _outage(bench, cycle)
        _verify(bench)
    result = _result(bench.figures, run.plan, delay)
    return {**result, "cpu_s_per_epoch": bench.meter.medians()}


@contextmanager
def _bench(run: Run, tag: str, at: Addresses) -> Iterator[Bench]:
    """The setting's sinks, claimed and warmed up, over parts closed on the way out."""
    made = run.made
    meter = Meter(
        admin_conninfo(made.servers.staging_url), made.prefix, at.proxy_pids, run.influxes.pids
    )
    staging = made.staging(MAIN)
    with ExitStack() as stack:
        opened = [
            stack.enter_context(TwoPhase.open(TwoPhaseConfig(staging, config)))
            for config in (at.single(), at.fan(), at.back())
        ]
        one, two, down = (Sink(s, f"{tag}-{s}", run.seeds, POINTS, meter) for s in SINKS)
        bench = Bench(run.plan, staging, at, one, two, down, opened[2], meter)
        _warm_up(bench, opened)
        yield bench


def _warm_up(bench: Bench, opened: Sequence[TwoPhase]) -> None:
    """Claims, connections, and the series of every database, before the clock runs.

    The outage's sink warms up through the parts that catch b up later. The claim
    starts their catch-up worker; the outage's claim fences it before b lags, so it
    sends nothing (it stops at its lease check) and the catch-ups stay on the clock."""
    for sink, tp in zip((bench.one, bench.two, bench.down), opened, strict=True):
        sink.attach(tp)
        sink.commit()
    bench.meter.samples.clear()


def _outage(bench: Bench, cycle: int) -> None:
    """b down: the first epoch (it pays ``target_deadline``), then the rotated repeats
    of every sink; then b back, its backlog caught up."""
    figures, plan = bench.figures, bench.plan
    first = bench.down.epoch
    # closed before the catch-up, as a driver gone away: its catch-up worker would
    # otherwise deliver b's backlog itself
    with TwoPhase.open(TwoPhaseConfig(bench.staging, bench.where.outage())) as tp:
        bench.down.attach(tp)
        figures.first_down.append(bench.down.commit(FIRST))
        runs = {"one": bench.one.commit, "two": bench.two.commit, "down": bench.down.commit}
        for repeat in range(plan.repeats):
            for side in _rotation(list(runs), cycle * plan.repeats + repeat):
                figures.epochs[side].append(runs[side]())
    figures.catch_up.append(_catch_up(bench, first))
    figures.backlog.append(bench.down.epoch - first)


def _rotation(names: list[str], turn: int) -> list[str]:
    """A B C, B C A, C A B...: no sink always right after the same other."""
    shift = turn % len(names)
    return names[shift:] + names[:shift]


def _catch_up(bench: Bench, first: int) -> float:
    """b's backlog (epochs ``first`` on) delivered by ``CatchUp.run`` on this thread;
    its points/s."""
    with bench.meter.measure("catch-up", per=bench.down.epoch - first):
        start = time.perf_counter()
        done = list(bench.back.catch_up.run(bench.down.lease).delivered)
        elapsed = time.perf_counter() - start
    expected = [("b", epoch) for epoch in range(first, bench.down.epoch)]
    if done != expected:
        raise BenchError(f"catch-up delivered {done}, expected {expected}")
    return len(done) * POINTS / elapsed


def _verify(bench: Bench) -> None:
    """Every epoch once in each database it belongs in (none lost, none doubled)."""
    sinks = {"one": bench.one, "two": bench.two, "down": bench.down}
    found = {
        name: (points_in(config), sinks[name.split("_")[0]].epoch * POINTS)
        for name, config in bench.where.dbs.items()
    }
    wrong = {name: pair for name, pair in found.items() if pair[0] != pair[1]}
    if wrong:
        raise BenchError(f"points in InfluxDB (found, expected): {wrong}")


def _rates(seconds: Sequence[float]) -> list[float]:
    return [POINTS / s for s in seconds]


def _result(figures: Figures, plan: Plan, delay: float) -> dict[str, Any]:
    """Each comparison against the one-target sink's epochs of the same setting; with
    ``paired``, the median of each repeat's own ratio (its epochs ran back to back, under
    the same load from other work) -- a catch-up's against its outage's repeats."""
    target = TARGET if delay else None  # loopback: reported
    extra = {"points": POINTS, "round_trip_ms": delay * 1000}
    one = _rates(figures.epochs["one"])
    per_outage = [
        statistics.median(one[k : k + plan.repeats]) for k in range(0, len(one), plan.repeats)
    ]
    sides = {
        "two targets / one": ("two targets", _rates(figures.epochs["two"]), one),
        "b down: a / one": ("a, b down", _rates(figures.epochs["down"]), one),
        "catch-up / live": ("b catching up", figures.catch_up, per_outage),
    }
    parts = {
        part: compared(
            "points/s",
            ((side, values), ("one target", one)),
            target,
            paired=round(statistics.median(v / o for v, o in zip(values, against, strict=True)), 3),
            **extra,
        )
        for part, (side, values, against) in sides.items()
    }
    parts["catch-up / live"]["backlog_epochs"] = figures.backlog
    worst = min(parts.values(), key=lambda p: p["ratio"])
    return {**worst, "parts": {**parts, FIRST: _first_epoch(figures, extra)}}


def _first_epoch(figures: Figures, extra: dict[str, Any]) -> dict[str, Any]:
    """The epoch that finds b down, in seconds, beside one target's epoch."""
    first, one = figures.first_down, figures.epochs["one"]
    made = compared("s", (("first epoch, b down", first), ("one target", one)), None, **extra)
    made["extra_s"] = round(statistics.median(first) - statistics.median(one), 3)
    return made


def run(args: argparse.Namespace) -> dict[str, Any]:
    plan = QUICK if args.quick else FULL
    started, clock = report.stamp(), time.monotonic()
    results: dict[str, Any] = {"started": started, "plan": plan.name, "machine": report.machine()}

    def log(message: str) -> None:
        print(f"[fanout {time.monotonic() - clock:6.1f}s] {message}", file=sys.stderr)

    with scratch(Servers.from_env()) as made, influx_servers(made, args.dev_server) as influxes:
        results["setup"] = _setup(plan, args.dev_server)
        results["metrics"] = measure(Run(made, influxes, plan, log))
    results["seconds"] = round(time.monotonic() - clock, 1)
    return results


def _setup(plan: Plan, dev_server: bool) -> dict[str, Any]:
    defaults = TargetConfig(url="http://unused")  # the settings a sink gets by default
    return {
        "influxd": "the dev server (two databases)" if dev_server else "two of the run's own",
        "points_per_epoch": POINTS,
        "outages": plan.cycles,
        "epochs_per_sink_and_outage": plan.repeats,
        "min_targets": defaults.min_targets,
        "target_deadline_s": defaults.target_deadline_s,
    }


def write(results: dict[str, Any], folder: Path) -> dict[str, Path]:
    """``fanout-<stamp>.json`` and ``.md`` in ``folder``; their paths."""
    return report.write_files(results, folder / f"fanout-{results['started']}", markdown)


def markdown(results: dict[str, Any]) -> str:
    """The comparisons, then where each epoch's CPU went."""
    machine = results["machine"]
    head = (
        f"Run {results['started']} ({results['plan']}, {results['seconds']:.0f} s) on "
        f"{machine['cpus']} x {machine['cpu']}, load average at start "
        f"{machine['load_average_at_start']}; influxd: {results['setup']['influxd']}.\n\n"
        "| setting, comparison | A median (min-max) | one target median (min-max) | unit "
        "| ratio | paired | target | holds |\n|---|---|---|---|---|---|---|---|\n"
    )
    rows = [
        _row(setting, name, part)
        for setting, metric in results["metrics"].items()
        for name, part in metric["parts"].items()
    ]
    return head + "\n".join(rows) + "\n\n" + _cpu_table(results) + "\n"


def _row(setting: str, name: str, part: dict[str, Any]) -> str:
    (a_name, a), (_, one) = part["sides"].items()
    ratio = f"{part['ratio']:.2f}" + (f" ({part['extra_s']:+.1f} s)" if "extra_s" in part else "")
    paired = f"{part['paired']:.2f}" if "paired" in part else "-"
    verdict = {True: "yes", False: "**no**", None: "-"}[part["holds"]]
    return (
        f"| {setting}, {name} | {a_name}: {_summary(a, part['unit'])} "
        f"| {_summary(one, part['unit'])} | {part['unit']} | {ratio} | {paired} "
        f"| {part['target']} | {verdict} |"
    )


def _summary(side: dict[str, Any], unit: str) -> str:
    form = "{:,.0f}" if unit == "points/s" else "{:.2f}"
    low, mid, high = (form.format(side[k]) for k in ("min", "median", "max"))
    return f"{mid} ({low}-{high}), n {side['n']}"


def _cpu_table(results: dict[str, Any]) -> str:
    rows = [
        f"| {setting} | {name} | {c['wall'] * 1000:,.0f} | {c['client']:.2f} | "
        f"{c['proxies']:.2f} | {c['influxd']:.2f} | {c['postgres']:.2f} | "
        f"{c['machine']:.2f} | {c['busy_cores']:.2f} | {c['n']} |"
        for setting, metric in results["metrics"].items()
        for name, c in metric["cpu_s_per_epoch"].items()
    ]
    return (
        "CPU seconds per epoch (medians; catch-up: per epoch of the backlog) of this "
        "process, the proxies, the influxd servers and the staging backends, the "
        "machine's (every process, others' too), and its busy cores over the same spans:\n\n"
        "| setting | epoch | wall ms | client | proxies | influxd | postgres | machine "
        "| busy cores | n |\n|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows)
    )


def main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench fanout", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="2 outages x 3 epochs (default 4 x 5)")
    ap.add_argument("--out", type=Path, default=report.RESULTS, help="results folder")
    ap.add_argument("--dev-server", action="store_true", help="every database on the dev InfluxDB")
    args = ap.parse_args(argv)
    results = run(args)
    return report.finish(markdown(results), write(results, args.out))
