"""What a scenario declares, and the one loop that runs every scenario.

A scenario names its sides (the first is the reference every other side is divided
by), its cases (epoch sizes, pipelines...) in a quick and a full plan, and one
function that runs one side on one case and returns that run's figures. Every figure
is a cost (seconds, CPU seconds): lower is better, so a ratio (the other side's
median over the reference's) above 1 means the reference side is cheaper.

Per case, the harness runs ``prepare`` once (off the clock: input files, databases),
then every side ``repeats`` times, the order rotating each repeat
(:func:`bench.harness.stats.rotated`), and summarises each figure per side.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness.cpu import CpuMeter
from bench.harness.servers import Scratch, admin_conninfo
from bench.harness.stats import Summary, ratio, rotated

Figures = dict[str, float]


@dataclass
class Context:
    """What every run gets: the plan, scratch databases, a work folder, shared state."""

    quick: bool
    scratch: Scratch
    work: Path  # the runs' logs, inputs and checkpoints
    keep: bool = False  # keep ``work`` at the end
    old: str = "HEAD"  # the revision a scenario comparing versions compares with
    state: dict[str, Any] = field(default_factory=dict)
    closers: list[Callable[[], None]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    runs: int = 0

    def log(self, message: str) -> None:
        print(f"[bench {time.monotonic() - self.started:6.1f}s] {message}", file=sys.stderr)

    def fresh(self) -> int:
        """A number no other run of this process took (seeds, names)."""
        self.runs += 1
        return self.runs

    def close(self) -> None:
        while self.closers:
            self.closers.pop()()
        if not self.keep:
            shutil.rmtree(self.work, ignore_errors=True)


@dataclass(frozen=True)
class Scenario:
    """One study: its sides, its cases per plan, and how to run one side on one case."""

    name: str
    about: str  # one line: what it measures
    sides: tuple[str, ...]  # the first is the reference
    cases: Callable[[bool], dict[str, Any]]  # quick -> {label: parameter}
    run: Callable[[Context, str, Any], Figures]
    repeats: tuple[int, int] = (1, 3)  # quick, full
    prepare: Callable[[Context, Any], None] | None = None
    notes: tuple[str, ...] = ()  # said under the table: how to read the figures
    headline: tuple[str, ...] = ()  # figures shown first, every case in one table

    @property
    def reference(self) -> str:
        return self.sides[0]


def measure(
    scenario: Scenario, ctx: Context, repeats: int | None = None, only: list[str] | None = None
) -> dict[str, Any]:
    """Every case of the plan (``only``: these), each side ``repeats`` times: the
    results' ``cases``."""
    count = repeats or scenario.repeats[0 if ctx.quick else 1]
    cases: dict[str, Any] = {}
    for label, parameter in scenario.cases(ctx.quick).items():
        if only and label not in only:
            continue
        if scenario.prepare is not None:
            scenario.prepare(ctx, parameter)
        values: dict[str, dict[str, list[float]]] = {side: {} for side in scenario.sides}

        def one(
            side: str,
            repeat: int,
            parameter: Any = parameter,
            label: str = label,
            values: Any = values,
        ) -> None:
            figures = scenario.run(ctx, side, parameter)
            ctx.log(f"{label}, {side}, repeat {repeat + 1}: {figures}")
            for name, value in figures.items():
                values[side].setdefault(name, []).append(value)

        rotated(count, scenario.sides, one)
        cases[label] = summarise(scenario, values)
    return cases


def summarise(scenario: Scenario, values: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    """Per figure: each side's summary, and each other side's ratio to the reference."""
    names = list(dict.fromkeys(n for side in values.values() for n in side))
    reference = values[scenario.reference]
    out: dict[str, Any] = {}
    for name in names:
        sides = {s: Summary.of(v[name]).as_dict() for s, v in values.items() if v.get(name)}
        ratios = {
            s: ratio(v[name], reference.get(name, []))
            for s, v in values.items()
            if s != scenario.reference and v.get(name)
        }
        out[name] = {"sides": sides, "ratios": {s: r for s, r in ratios.items() if r is not None}}
    return out


def in_process(ctx: Context, make: Callable[[Context], dict[str, Any]]) -> dict[str, Any]:
    """The sides of a scenario that runs them in this process: ``make(ctx)`` on first
    use (it adds their closing to ``ctx.closers``); with the CPU meter :func:`timed` uses."""
    if "sides" not in ctx.state:
        ctx.state["sides"] = make(ctx)
        conninfo = admin_conninfo(ctx.scratch.servers.staging_url)
        ctx.state["meter"] = CpuMeter(conninfo, ctx.scratch.prefix)
    return dict(ctx.state["sides"])


def timed(ctx: Context, runner: Any, epoch: Any) -> tuple[float, dict[str, float]]:
    """``runner.run(epoch)``'s wall seconds, and the CPU seconds it took per process."""
    with ctx.state["meter"].measure() as cpu:
        seconds = runner.run(epoch)
    return float(seconds), cpu
