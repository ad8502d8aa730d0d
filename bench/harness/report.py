"""The one report: ``bench/results/<scenario>-<stamp>.json``, its Markdown table and its
chart (every ratio of the run, one bar each; none without matplotlib)."""

from __future__ import annotations

import json
import os
import platform
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results"


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()}",
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def _cell(summary: dict[str, Any] | None) -> str:
    if summary is None:
        return ""
    if summary["n"] == 1:
        return f"{summary['median']:.3f}"
    return f"{summary['median']:.3f} ({summary['min']:.3f}..{summary['max']:.3f})"


def markdown(results: dict[str, Any]) -> str:
    """A table per case: one row per figure, each side's median (min..max), the ratios."""
    sides: list[str] = results["sides"]
    reference, others = sides[0], sides[1:]
    head = ["figure", *sides, *(f"{o} / {reference}" for o in others)]
    out = [
        f"# {results['scenario']}: {results['about']}",
        "",
        f"Run {results['started']} ({results['plan']} plan, {results['repeats']} repeats, "
        f"{results['machine']['cpus']} cores, load at start "
        f"{results['machine']['load_average_at_start']}). Medians (min..max); a ratio "
        f"above 1 means {reference} costs less.",
    ]
    out += headline(results)
    for label, figures in results["cases"].items():
        out += ["", f"## {label}", "", "| " + " | ".join(head) + " |"]
        out.append("|" + "---|" * len(head))
        for name, figure in figures.items():
            cells = [_cell(figure["sides"].get(side)) for side in sides]
            ratios = [figure["ratios"].get(o) for o in others]
            ratio_cells = ["" if r is None else f"{r:.2f}" for r in ratios]
            out.append("| " + " | ".join([name, *cells, *ratio_cells]) + " |")
    out += ["", *(f"* {note}" for note in results["notes"])] if results["notes"] else []
    return "\n".join(out) + "\n"


def headline(results: dict[str, Any]) -> list[str]:
    """The headline figures of every case in one table (the one pages quote), else
    nothing."""
    names: list[str] = results.get("headline") or []
    if not names:
        return []
    sides: list[str] = results["sides"]
    head = ["case", "figure", *sides, *(f"{o} / {sides[0]}" for o in sides[1:])]
    out = ["", "## Headline", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, figures in results["cases"].items():
        for name in (n for n in names if n in figures):
            figure = figures[name]
            cells = [_cell(figure["sides"].get(side)) for side in sides]
            ratios = [figure["ratios"].get(o) for o in sides[1:]]
            ratio_cells = ["" if r is None else f"{r:.2f}" for r in ratios]
            out.append("| " + " | ".join([label, name, *cells, *ratio_cells]) + " |")
    return out


def chart(results: dict[str, Any], path: Path) -> bool:
    """Every ratio of the run as a bar, a line at 1; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    labels, values = [], []
    for case, figures in results["cases"].items():
        for name, figure in figures.items():
            for side, value in figure["ratios"].items():
                labels.append(f"{case}: {name} ({side})")
                values.append(value)
    if not values:
        return False
    fig, ax = plt.subplots(figsize=(9, 0.3 * len(values) + 1.2))
    ax.barh(range(len(values)), values, color=["#4c72b0" if v >= 1 else "#dd8452" for v in values])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(values)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"other side / {results['sides'][0]} (above 1: {results['sides'][0]} costs less)")
    ax.set_title(f"{results['scenario']} ({results['started']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write(results: dict[str, Any], out: Path, draw: bool = True) -> Path:
    """The JSON, the Markdown and (``draw``) the chart; the JSON's path."""
    out.mkdir(parents=True, exist_ok=True)
    base = out / f"{results['scenario']}-{results['started']}"
    base.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    base.with_suffix(".md").write_text(markdown(results))
    if draw:
        chart(results, base.with_suffix(".png"))
    return base.with_suffix(".json")
