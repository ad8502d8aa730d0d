"""``bench.pg_target``'s table: a row per epoch size (twophase's steady points/s over the
plain upsert's), where each side's micro-batch time goes, the CPU per process; the chart."""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.costs_spark import median_of
from bench.pg_target_job import PLAIN, TWOPHASE

TARGET = 0.9  # twophase's steady points/s at least this times plain's
PROCESSES = ("driver", "jvm", "workers", "staging_pg", "target_pg")
# the commit log's steps (twophase/spark/driver_commit.py, protocol/commit/committer.py), in order
STEPS = ("stage", "recover", "decide", "promote")
Row = dict[str, Any]


def rows(sizes: dict[str, Any]) -> list[Row]:
    """One row per epoch size: both sides' median steady points/s, the ratio, the verdict."""
    out = []
    for size, part in sizes.items():
        runs = part["runs"]
        tp, plain = (median_of(runs[side], "steady_points_per_s") for side in (TWOPHASE, PLAIN))
        ratio = tp / plain if plain > 0 else None
        out.append(
            {
                "size": int(size),
                "twophase_points_per_s": round(tp),
                "plain_points_per_s": round(plain),
                "points_per_s": {
                    side: [r["steady_points_per_s"] for r in runs[side]] for side in runs
                },
                "wall_s": {side: median_of(runs[side], "wall_s") for side in runs},
                "ratio": None if ratio is None else round(ratio, 3),
                "target": f">= {TARGET}x plain",
                "holds": None if ratio is None else ratio >= TARGET,
            }
        )
    return out


def steps(part: dict[str, Any]) -> dict[str, float]:
    """twophase's median milliseconds per steady epoch of each step (stage, recover,
    decide, promote, in the commit's order; any other after), over every run's steady
    epochs."""
    epochs = [e for r in part["runs"][TWOPHASE] for e in r["stages"].get("steps_ms", [])]
    seen = {name for epoch in epochs for name in epoch}
    names = [n for n in STEPS if n in seen] + sorted(seen - set(STEPS))
    return {name: statistics.median(e.get(name, 0.0) for e in epochs) for name in names}


def plain_stages(part: dict[str, Any]) -> dict[str, float]:
    """The plain writer's task-milliseconds per micro-batch: in its partitions, of which
    in ``executemany``."""
    stages = [r["stages"] for r in part["runs"][PLAIN] if "partitions_s" in r.get("stages", {})]
    if not stages:
        return {}
    per = 1000 / part["epochs"]
    return {
        "partitions (rows to Python, convert, upsert)": statistics.median(
            s["partitions_s"] for s in stages
        )
        * per,
        "of which executemany": statistics.median(s["execute_s"] for s in stages) * per,
    }


# -- Markdown ----------------------------------------------------------------------------


def _verdict(holds: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "-"}[holds]


def markdown(results: dict[str, Any]) -> str:
    m, s = results["machine"], results["settings"]
    head = [
        f"# bench.pg_target {results['started']} ({results['plan']}, {results['seconds']} s)",
        "",
        f"{m['cpus']} cores ({m['cpu']}), load average at start {m['load_average_at_start']}; "
        f"{s['epochs']} epochs per job, {s['reps']} job(s) per side and size",
        "",
        "| points per epoch | twophase points/s | plain points/s | ratio | target | holds "
        "| wall s (twophase / plain) |",
        "|---|---|---|---|---|---|---|",
    ]
    body = [
        f"| {r['size']:,} | {r['twophase_points_per_s']:,} | {r['plain_points_per_s']:,} "
        f"| {'-' if r['ratio'] is None else r['ratio']} | {r['target']} | "
        f"{_verdict(r['holds'])} | {r['wall_s'][TWOPHASE]:.1f} / {r['wall_s'][PLAIN]:.1f} |"
        for r in results["rows"]
    ]
    details = [*_step_table(results["sizes"]), *_cpu_table(results["sizes"])]
    return "\n".join([*head, *body, *details]) + "\n"


def _step_table(sizes: dict[str, Any]) -> Iterator[str]:
    yield ""
    yield "Where a steady micro-batch's time goes (ms per batch, medians):"
    yield ""
    yield "| points per epoch | side | step | ms |"
    yield "|---|---|---|---|"
    for size, part in sizes.items():
        for side, found in ((TWOPHASE, steps(part)), (PLAIN, plain_stages(part))):
            steady = median_of(part["runs"][side], "steady_ms")
            yield f"| {int(size):,} | {side} | micro-batch (triggerExecution) | {steady:.0f} |"
            unit = " (task-ms)" if side == PLAIN else ""
            for step, ms in found.items():
                yield f"| {int(size):,} | {side} | {step}{unit} | {ms:.0f} |"
            if side == TWOPHASE and found:  # Spark's read, the writer's own calls
                other = steady - sum(found.values())
                yield f"| {int(size):,} | {side} | rest of the micro-batch | {other:.0f} |"


def _cpu_table(sizes: dict[str, Any]) -> Iterator[str]:
    yield ""
    yield "CPU seconds per million points (whole job, medians):"
    yield ""
    yield "| points per epoch | side | " + " | ".join(PROCESSES) + " | total |"
    yield "|---|---|" + "---|" * (len(PROCESSES) + 1)
    for size, part in sizes.items():
        for side, runs in part["runs"].items():
            cpu = [median_of(runs, "cpu_s_per_million", p) for p in PROCESSES]
            cells = " | ".join(f"{c:.2f}" for c in cpu)
            yield f"| {int(size):,} | {side} | {cells} | {sum(cpu):.2f} |"


# -- chart --------------------------------------------------------------------------------


def chart(results: dict[str, Any], path: Path) -> bool:
    """Steady points/s of each side per epoch size (every run a dot), ratio above."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8, 5))
    _bars(ax, results["rows"])
    ax.set_title(f"bench.pg_target {results['started']} ({results['plan']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _bars(ax: Any, table: Sequence[Row]) -> None:
    labels = [f"{r['size']:,}" for r in table]
    for offset, side in ((-0.2, TWOPHASE), (0.2, PLAIN)):
        xs = [i + offset for i in range(len(table))]
        ax.bar(xs, [r[f"{side}_points_per_s"] for r in table], width=0.4, label=side)
        for x, r in zip(xs, table, strict=True):
            ax.plot([x] * len(r["points_per_s"][side]), r["points_per_s"][side], "k.")
    for i, r in enumerate(table):
        top = max(r["twophase_points_per_s"], r["plain_points_per_s"])
        ax.annotate(f"{r['ratio']}x", (i, top), ha="center", va="bottom")
    ax.set_xticks(range(len(table)), labels)
    ax.set_xlabel("points per epoch")
    ax.set_ylabel("steady points/s")
    ax.legend()
