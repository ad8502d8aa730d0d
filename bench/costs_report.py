"""``bench.costs``'s table: one row per figure of the comparison, from the parts' results;
the stage, CPU and profile tables under it; the chart."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.costs_job import NOOP, PLAIN, TWOPHASE
from bench.costs_spark import PROCESSES, median_of

Row = dict[str, Any]
# loopback twophase / direct in the run docs/performance.md quotes (20261126T063210Z)
LOOPBACK_BEFORE = {"100000": 0.98, "1000000": 0.90}
LOOPBACK_SLACK = 0.05  # "no worse": within this of the ratio before (its runs scatter so)
WRITERS = ("driver", "jvm", "workers", "postgres")  # the CPU a writer adds (influxd apart)


def row(metric: str, figure: str, ratio: float | None, target: str, holds: bool | None) -> Row:
    return {
        "metric": metric,
        "figure": figure,
        "ratio": None if ratio is None else round(ratio, 3),
        "target": target,
        "holds": holds,
    }


def _failed(metric: str, part: dict[str, Any] | None, target: str) -> Row | None:
    if part is None:
        return row(metric, "not run", None, target, None)
    if "failed" in part:
        return row(metric, f"failed: {part['failed'][:200]}", None, target, None)
    return None


def rows(parts: dict[str, Any]) -> list[Row]:
    makers: Sequence[tuple[str, str, str, Callable[[dict[str, Any]], list[Row]]]] = (
        ("csv", "1 one point per row, vs plain foreachBatch", ">= 1.1x", _csv_rows),
        ("seeds", "3 seeds' job vs its plain pipeline", ">= 1.0x", _seeds_rows),
        ("staging", "4 executors' staging CPU per M points", "<= 40% of rows", _staging_rows),
        ("relay", "6 driver CPU per M points promoted", "<= 0.25 s", _relay_rows),
        ("roundtrip", "7 slow link, inline vs direct x4 gzip 1", ">= 1.0x", _slow_rows),
        ("fanout_stub", "8 two targets vs one, 20 ms, stubs", ">= 0.95x", _stub_rows),
        ("fanout_real", "9 two targets vs one, real influxd", "reported", _real_rows),
        ("throughput", "10 loopback vs direct", "no worse than before", _loop_rows),
    )
    out: list[Row] = []
    for name, metric, target, make in makers:
        failed = _failed(metric, parts.get(name), target)
        out.extend([failed] if failed else make(parts[name]))
        if name == "csv":
            out.extend(_stage_rows(parts))
    return sorted(out, key=lambda r: int(r["metric"].split()[0]))  # stable: by row number


def _wall(runs: Sequence[dict[str, Any]]) -> float:
    return float(statistics.median(r["wall_s"] for r in runs))


def _csv_rows(part: dict[str, Any]) -> list[Row]:
    runs = part["runs"]
    tp, plain = _wall(runs[TWOPHASE]), _wall(runs[PLAIN])
    steady = {s: median_of(runs[s], "steady_ms") for s in (TWOPHASE, PLAIN)}
    figure = (
        f"{part['batches']} x {part['rows_per_batch']:,} rows: twophase {tp:.1f} s, "
        f"plain {plain:.1f} s (steady batch {steady[TWOPHASE]:.0f} / {steady[PLAIN]:.0f} ms)"
    )
    added = _added(runs)
    return [
        row(
            "1 one point per row, vs plain foreachBatch",
            figure,
            plain / tp,
            ">= 1.1x",
            plain / tp >= 1.1,
        ),
        row(
            "5 twophase's added CPU vs the plain writer's, per M points",
            f"twophase {added[TWOPHASE]:.2f} s, plain {added[PLAIN]:.2f} s "
            "(over noop; influxd apart)",
            added[TWOPHASE] / added[PLAIN] if added[PLAIN] > 0 else None,
            "<= 1.0x",
            added[TWOPHASE] <= added[PLAIN],
        ),
    ]


def cpu_per_million(runs: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Per process, the median CPU seconds per million points of ``runs``."""
    return {p: median_of(runs, "cpu_s_per_million", p) for p in PROCESSES}


def _added(runs: dict[str, Sequence[dict[str, Any]]]) -> dict[str, float]:
    """Each writer's CPU per million points over the pipeline without one (noop)."""
    base = sum(cpu_per_million(runs[NOOP])[p] for p in WRITERS)
    return {
        side: sum(cpu_per_million(runs[side])[p] for p in WRITERS) - base
        for side in (TWOPHASE, PLAIN)
    }


def _stage_rows(parts: dict[str, Any]) -> list[Row]:
    csv = parts.get("csv", {})
    profiles = csv.get("profiles", {}) if "failed" not in csv else {}
    if not profiles:
        return [row("2 each epoch's time, stage by stage", "no profile", None, "reported", None)]
    text = "; ".join(
        f"{side}: " + ", ".join(f"{k} {v:.0f} ms" for k, v in p["steps_ms_per_batch"].items())
        for side, p in profiles.items()
    )
    return [
        row("2 each epoch's time, stage by stage", text + " (tables below)", None, "reported", None)
    ]


def _seeds_rows(part: dict[str, Any]) -> list[Row]:
    out = []
    for per_trigger, runs in part.items():
        if per_trigger == "seconds":
            continue
        job, plain = _wall(runs["job"]), _wall(runs["plain"])
        steady = {s: median_of(runs[s], "steady_ms") for s in ("job", "plain")}
        figure = (
            f"{per_trigger} file(s)/trigger: job {job:.1f} s, plain {plain:.1f} s "
            f"(steady batch {steady['job']:.0f} / {steady['plain']:.0f} ms)"
        )
        out.append(
            row(
                f"3 seeds' job vs its plain pipeline, {per_trigger}/trigger",
                figure,
                plain / job,
                ">= 1.0x",
                plain >= job,
            )
        )
    return out


def _staging_rows(part: dict[str, Any]) -> list[Row]:
    per = part["per_million"]
    col, rws = (statistics.median(per[w]["executor"]) for w in ("columnar", "rows"))
    figure = (
        f"columnar {col:.2f} s (encode {per['columnar']['encode']:.2f}, compress+COPY "
        f"{per['columnar']['stage']:.2f}), rows {rws:.2f} s (encode {per['rows']['encode']:.2f}); "
        f"PostgreSQL {per['columnar']['postgres']:.2f} s"
    )
    return [
        row(
            "4 executors' staging CPU per M points",
            figure,
            col / rws,
            "<= 40% of rows",
            col / rws <= 0.4,
        )
    ]


def _relay_rows(part: dict[str, Any]) -> list[Row]:
    gz = part["gzip"]["driver_cpu_s_per_m"]["median"]
    figure = f"{gz:.2f} s per M points (gzip, {part['points']:,}-point epochs)"
    return [row("6 driver CPU per M points promoted", figure, gz, "<= 0.25 s", gz <= 0.25)]


def _slow_rows(part: dict[str, Any]) -> list[Row]:
    key = next(k for k in part["parts"] if "100 Mbit/s: twophase / direct x4 gzip level 1" in k)
    item = part["parts"][key]
    sides = item["sides"]
    figure = ", ".join(f"{name} {s['median']:,.0f}" for name, s in sides.items()) + " points/s"
    ratio = item["ratio"]
    return [row("7 slow link, inline vs direct x4 gzip 1", figure, ratio, ">= 1.0x", ratio >= 1.0)]


def _stub_rows(part: dict[str, Any]) -> list[Row]:
    figure = ", ".join(f"{n} {s['median']:,.0f}" for n, s in part["sides"].items()) + " points/s"
    ratio = part["ratio"]
    return [row("8 two targets vs one, 20 ms, stubs", figure, ratio, ">= 0.95x", ratio >= 0.95)]


def _real_rows(part: dict[str, Any]) -> list[Row]:
    item = part["parts"]["two targets / one"]
    cpu = part["cpu_s_per_epoch"]
    figure = ", ".join(f"{n} {s['median']:,.0f}" for n, s in item["sides"].items()) + " points/s"
    figure += "; CPU s/epoch " + "; ".join(
        f"{name}: client {cpu[name]['client']}, influxd {cpu[name]['influxd']}, "
        f"postgres {cpu[name]['postgres']}"
        for name in ("one", "two")
        if name in cpu
    )
    return [row("9 two targets vs one, real influxd", figure, item["ratio"], "reported", None)]


def _loop_rows(part: dict[str, Any]) -> list[Row]:
    out = []
    for size, item in part["by_size"].items():
        before = LOOPBACK_BEFORE.get(size)
        ratio = item["ratio"]
        figure = (
            ", ".join(f"{n} {s['median']:,.0f}" for n, s in item["sides"].items()) + " points/s"
        )
        target = f">= {before} - {LOOPBACK_SLACK} (before: {before})" if before else "reported"
        holds = None if before is None else ratio >= before - LOOPBACK_SLACK
        out.append(
            row(f"10 loopback vs direct, {int(size):,} points", figure, ratio, target, holds)
        )
    return out


# -- Markdown ----------------------------------------------------------------------------


def _verdict(holds: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "-"}[holds]


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    head = [
        f"# bench.costs {results['started']} ({results['plan']}, {results['seconds']} s)",
        "",
        f"{m['cpus']} cores ({m['cpu']}), load average at start {m['load_average_at_start']}",
        "",
        "| metric | figures | ratio / value | target | holds |",
        "|---|---|---|---|---|",
    ]
    body = [
        f"| {r['metric']} | {r['figure']} | {'-' if r['ratio'] is None else r['ratio']} "
        f"| {r['target']} | {_verdict(r['holds'])} |"
        for r in results["rows"]
    ]
    return "\n".join([*head, *body, *_details(results["parts"])]) + "\n"


def _details(parts: dict[str, Any]) -> Iterator[str]:
    csv = parts.get("csv", {})
    if csv and "failed" not in csv:
        yield from _cpu_table(csv)
        yield from _stage_table(csv, parts)
        yield from _profile_tables(csv)


def _cpu_table(csv: dict[str, Any]) -> Iterator[str]:
    yield ""
    yield f"CPU seconds per million points, CSV pipeline ({csv['points']:,} points, medians):"
    yield ""
    yield "| side | wall s | " + " | ".join(PROCESSES) + " | total |"
    yield "|---|---|" + "---|" * (len(PROCESSES) + 1)
    for side, runs in csv["runs"].items():
        cpu = cpu_per_million(runs)
        cells = " | ".join(f"{cpu[p]:.2f}" for p in PROCESSES)
        yield f"| {side} | {_wall(runs):.1f} | {cells} | {sum(cpu.values()):.2f} |"


def _stage_table(csv: dict[str, Any], parts: dict[str, Any]) -> Iterator[str]:
    yield ""
    yield "Where a micro-batch's time goes (ms per batch; profiles of one run per side):"
    yield ""
    yield "| pipeline | step | ms per batch |"
    yield "|---|---|---|"
    for side in (TWOPHASE, PLAIN):
        steady = median_of(csv["runs"][side], "steady_ms")
        yield f"| {side} | steady micro-batch (triggerExecution) | {steady:.0f} |"
        for step, ms in csv["profiles"].get(side, {}).get("steps_ms_per_batch", {}).items():
            yield f"| {side} | {step} | {ms:.0f} |"
    stages = [r["stages"] for r in csv["runs"][PLAIN] if r.get("stages")]
    if stages:
        batches = csv["batches"]
        part_s = statistics.median(s["partitions_s"] for s in stages) / batches * 1000
        post_s = statistics.median(s["post_s"] for s in stages) / batches * 1000
        yield f"| {PLAIN} | tasks: rows to Python, format (task-ms) | {part_s - post_s:.0f} |"
        yield f"| {PLAIN} | tasks: POST to InfluxDB (task-ms) | {post_s:.0f} |"
    yield from _in_process_rows(parts)


def _in_process_rows(parts: dict[str, Any]) -> Iterator[str]:
    staging = parts.get("staging", {})
    if staging and "failed" not in staging:
        per = staging["per_million"]
        labels = {"encode": "encode", "stage": "compress + COPY", "postgres": "PostgreSQL COPY"}
        for way in ("columnar", "rows"):
            for what, label in labels.items():
                figure = per[way][what]
                yield f"| staging, {way} (in process) | {label}, CPU s/M points | {figure:.2f} |"
    steps = parts.get("steps", {})
    if steps and "failed" not in steps:
        for step, ms in steps["ms"].items():
            yield f"| one {steps['points']:,}-point epoch (bench.steps) | {step} | {ms:.0f} |"


def _profile_tables(csv: dict[str, Any]) -> Iterator[str]:
    for side, prof in csv.get("profiles", {}).items():
        yield ""
        yield (
            f"Profile of {side}'s foreachBatch ({prof['calls']} calls, run of "
            f"{prof['wall_s']:.1f} s), top cumulative:"
        )
        yield ""
        yield "| function | calls | cumulative s |"
        yield "|---|---|---|"
        for item in prof["top_cumulative"][:12]:
            yield f"| `{item['function']}` | {item['calls']} | {item['cum_s']:.2f} |"


# -- chart --------------------------------------------------------------------------------


def chart(results: dict[str, Any], path: Path) -> bool:
    """Ratios against their targets, and the CSV pipeline's CPU per process."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.5))
    _ratio_bars(left, results["rows"])
    csv = results["parts"].get("csv", {})
    if csv and "failed" not in csv:
        _cpu_bars(right, csv)
    fig.suptitle(f"bench.costs {results['started']} ({results['plan']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _ratio_bars(ax: Any, table: Sequence[Row]) -> None:
    shown = [r for r in table if r["ratio"] is not None]
    colours = [
        "tab:green" if r["holds"] else "tab:red" if r["holds"] is False else "tab:gray"
        for r in shown
    ]
    ax.barh([r["metric"][:42] for r in shown], [r["ratio"] for r in shown], color=colours)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.invert_yaxis()
    ax.set_xlabel("ratio or value (green: holds, red: misses, grey: reported)")


def _cpu_bars(ax: Any, csv: dict[str, Any]) -> None:
    sides = list(csv["runs"])
    bottom = [0.0] * len(sides)
    for process in PROCESSES:
        values = [cpu_per_million(csv["runs"][s])[process] for s in sides]
        ax.bar(sides, values, bottom=bottom, label=process)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("CPU s per million points")
    ax.set_title("CSV pipeline, one point per row")
    ax.legend()
