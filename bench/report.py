"""The results file, its Markdown table and the throughput chart."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
REPO = RESULTS.parent.parent
TITLES = {
    "throughput": "1 throughput",
    "fixed_cost": "2 fixed cost (10-point epochs)",
    "history": "3 flat with history",
    "memory": "4 memory of the promoter",
    "recovery": "5 recovery",
    "spark_e2e": "6 Spark end to end",
    "scrape": "7 exporter scrape",
    "background": "8 background promotion, epochs in a row",
    "spark_raw": "9 Spark, many points per batch",
    "roundtrip": "10 promotion 20 ms away, lanes and compression",
    "stage_memory": "11 memory of a staging task",
    "freshness": "12 freshness, event to dashboard",
    "relay": "13 the driver as a relay",
    "staging_scale": "14 the staging store's scale",
}


def machine() -> dict[str, Any]:
    return {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "cpu": _cpu_model(),
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()}",
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for text in handle:
                if text.startswith("model name"):
                    return text.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def _number(value: float, unit: str) -> str:
    if unit == "points/s":
        return f"{value:,.0f}"
    return f"{value:,.1f}" if value >= 10 else f"{value:.2f}"


def _side(side: dict[str, Any], unit: str) -> str:
    return (
        f"{_number(side['median'], unit)} ({_number(side['min'], unit)}-"
        f"{_number(side['max'], unit)})"
    )


def _verdict(holds: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "-"}[holds]


def _rows(name: str, metric: dict[str, Any]) -> Iterator[str]:
    title = TITLES.get(name, name)
    if "skipped" in metric:
        yield f"| {title} | - | - | - | - | skipped: {metric['skipped']} |"
        return
    for label, item in _parts(metric):
        sides = list(item["sides"].items())
        (a_name, a), (b_name, b) = sides[0], sides[1]
        unit = item["unit"]
        yield (
            f"| {title}{label} | {a_name}: {_side(a, unit)} | {b_name}: {_side(b, unit)} "
            f"| {unit} | {_ratio(item)} | {item['target']} | {_verdict(item['holds'])} |"
        )


def _ratio(item: dict[str, Any]) -> str:
    """The ratio, and for a target on a difference (seconds over plain) the difference."""
    if "extra_s" in item:
        return f"{item['ratio']:.2f} ({item['extra_s']:+.1f} s)"
    return f"{item['ratio']:.2f}"


def _parts(metric: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    if "parts" in metric:  # rows named by the metric itself
        for name, item in metric["parts"].items():
            yield f", {name}", item
        return
    by_size = metric.get("by_size")
    if not by_size:
        yield "", metric
        return
    for size, item in by_size.items():
        yield f", {size_label(int(size))} points", item


def size_label(points: int) -> str:
    return f"{points // 1_000_000}M" if points >= 1_000_000 else f"{points // 1_000}k"


def markdown(results: dict[str, Any]) -> str:
    head = (
        f"Run {results['started']} ({results['plan']}, {results['seconds']:.0f} s) on "
        f"{results['machine']['cpus']} x {results['machine']['cpu']}, load average at start "
        f"{results['machine']['load_average_at_start']}.\n\n"
        "| metric | A median (min-max) | B median (min-max) | unit | ratio | target | holds |\n"
        "|---|---|---|---|---|---|---|\n"
    )
    rows = [row for name, metric in results["metrics"].items() for row in _rows(name, metric)]
    return head + "\n".join(rows) + "\n"


def _pyplot() -> Any:
    """matplotlib's pyplot on a backend without a display, or None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def chart(results: dict[str, Any], path: Path) -> bool:
    """Throughput against epoch size for both sides (medians, min-max bars); False if no
    matplotlib."""
    plt = _pyplot()
    if plt is None:
        return False
    by_size = results["metrics"].get("throughput", {}).get("by_size")
    if not by_size:
        return False
    sizes = [int(s) for s in by_size]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for side, marker in (("twophase", "o"), ("direct", "s")):
        _plot_side(ax, sizes, [by_size[str(s)]["sides"][side] for s in sizes], side, marker)
    ax.set_xscale("log")
    ax.set_xlabel("points per epoch")
    ax.set_ylabel("points/s (median, min-max)")
    ax.set_title(f"twophase vs direct write, {results['started']} ({results['plan']})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def spark_chart(results: dict[str, Any], path: Path) -> bool:
    """Metric 6: wall and steady-batch time of each side per files-per-trigger setting
    (medians, min-max bars); False without matplotlib or Spark figures."""
    parts = results["metrics"].get("spark_e2e", {}).get("parts")
    if not parts:
        return False
    plt = _pyplot()
    if plt is None:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(9, 4), dpi=110)
    for ax, (what, unit) in zip(axes, (("wall", "s"), ("steady batch", "ms")), strict=True):
        _spark_bars(ax, parts, what)
        ax.set_title(f"{what} ({unit}), lower is better")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"Spark end to end, {results['started']}")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def link_chart(results: dict[str, Any], path: Path) -> bool:
    """Metric 10: points/s of every side on each link (medians, min-max bars); False
    without matplotlib or metric 10's figures."""
    parts = results["metrics"].get("roundtrip", {}).get("parts")
    if not parts:
        return False
    plt = _pyplot()
    if plt is None:
        return False
    links = _sides_by_link(parts)
    fig, axes = plt.subplots(1, len(links), figsize=(5 * len(links), 4.4), dpi=110)
    for ax, (link, sides) in zip(axes, links.items(), strict=True):
        names = sorted(sides, key=lambda n: -sides[n]["median"])
        medians = [sides[n]["median"] / 1000 for n in names]
        low = [(sides[n]["median"] - sides[n]["min"]) / 1000 for n in names]
        high = [(sides[n]["max"] - sides[n]["median"]) / 1000 for n in names]
        colors = ["tab:blue" if n.startswith("twophase") else "tab:gray" for n in names]
        ax.barh(names, medians, xerr=[low, high], capsize=3, color=colors)
        ax.invert_yaxis()
        ax.set_title(link)
        ax.set_xlabel("thousand points/s (median, min-max)")
        ax.grid(True, axis="x", alpha=0.3)
    fig.suptitle(f"Promotion to an InfluxDB 20 ms away, {results['started']}")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def _sides_by_link(parts: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{link: {side: its summary}}`` from metric 10's parts ("1M, <link>: a / b")."""
    links: dict[str, dict[str, dict[str, Any]]] = {}
    for name, part in parts.items():
        link = name.split(": ")[0].split(", ", 1)[1]
        links.setdefault(link, {}).update(part["sides"])
    return links


def _spark_bars(ax: Any, parts: dict[str, Any], what: str) -> None:
    """Grouped bars: one group per setting, one bar per side (plain, job, sink only)."""
    settings = sorted({name.split(",")[0] for name in parts}, key=lambda x: int(x.split()[0]))
    for offset, side in enumerate(("plain", "job", "sink_only")):
        medians, low, high = [], [], []
        for setting in settings:
            owner = "job" if side == "plain" else side
            summary = parts[f"{setting}, {owner} {what}"]["sides"][side]
            medians.append(summary["median"])
            low.append(summary["median"] - summary["min"])
            high.append(summary["max"] - summary["median"])
        xs = [i + (offset - 1) * 0.27 for i in range(len(settings))]
        ax.bar(xs, medians, 0.27, yerr=[low, high], capsize=3, label=side.replace("_", " "))
    ax.set_xticks(range(len(settings)), settings)


def _plot_side(
    ax: Any, sizes: list[int], sides: list[dict[str, Any]], label: str, marker: str
) -> None:
    medians = [s["median"] for s in sides]
    low = [s["median"] - s["min"] for s in sides]
    high = [s["max"] - s["median"] for s in sides]
    ax.errorbar(sizes, medians, yerr=[low, high], marker=marker, capsize=3, label=label)


def write(results: dict[str, Any], folder: Path = RESULTS) -> dict[str, Path]:
    """``<stamp>.json``, ``<stamp>.md`` and ``<stamp>.png`` in ``folder``; their paths."""
    base = folder / results["started"]
    paths = write_files(results, base, markdown, chart)
    spark = base.with_name(f"{base.name}-spark.png")
    if spark_chart(results, spark):
        paths["spark_png"] = spark
    links = base.with_name(f"{base.name}-links.png")
    if link_chart(results, links):
        paths["links_png"] = links
    return paths


# What every part of the bench writes and prints: the results files, then the ending.


def write_json(results: dict[str, Any], path: Path) -> Path:
    """``results`` as indented JSON at ``path`` (written whole: a reader never sees half
    of it); ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=2, default=str) + "\n")
    tmp.replace(path)
    return path


def write_files(
    results: dict[str, Any],
    base: Path,
    markdown: Callable[[dict[str, Any]], str],
    chart: Callable[[dict[str, Any], Path], bool] | None = None,
) -> dict[str, Path]:
    """``base``.json, ``base``.md (``markdown(results)``) and ``base``.png when ``chart``
    draws one; their paths by kind."""
    paths = {"json": write_json(results, base.with_suffix(".json")), "md": base.with_suffix(".md")}
    paths["md"].write_text(markdown(results))
    if chart is not None and chart(results, base.with_suffix(".png")):
        paths["png"] = base.with_suffix(".png")
    return paths


def finish(text: str, paths: dict[str, Path]) -> int:
    """A part's ending: its summary, then ``kind: path`` per results file; exit status 0
    (whether or not targets hold: the results say)."""
    print(text)
    print("\n".join(f"{kind}: {path}" for kind, path in paths.items()))
    return 0


def best_of(parts: dict[str, Any], headline: str, best: dict[str, str]) -> dict[str, Any]:
    """A metric of parts whose target binds the better twophase mode of each link (metrics
    9 and 12): the ``headline`` part's figures, then ``holds`` over every part held to a
    target, ``best`` (the mode per link) and the ``parts``."""
    return {
        **parts[headline],
        "holds": all(p["holds"] for p in parts.values() if p["holds"] is not None),
        "best": best,
        "parts": parts,
    }


def command(part: str, argv: Sequence[str]) -> str:
    """How a part was run, for its results file: ``python -m bench PART ARGS...``."""
    return " ".join([Path(sys.executable).name, "-m", "bench", part, *argv])


def checkout() -> dict[str, str]:
    """The commit measured and the tracked files changed against it."""
    return {
        "commit": _git("rev-parse", "HEAD"),
        "uncommitted_changes": _git("status", "--porcelain", "--untracked-files=no"),
    }


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
    return done.stdout.strip()
