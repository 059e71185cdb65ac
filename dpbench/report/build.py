"""Comparison table and plots of a set of runs (mean over seeds of identical configurations)."""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from pathlib import Path
from statistics import mean
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dpbench.report.collect import collect_results, swept_keys  # noqa: E402

COLUMNS = ("label", "model", "data", "batch_size", "target_epsilon", "epsilon", "test_metric", "test_value",
           "samples_per_s", "peak_memory_mb", "runs")
# Swept keys already shown by the fixed columns (or by the label).
SHOWN = {"model.name", "data.name", "privatizer.name", "batch_size", "privacy.epsilon"}


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    if not present:
        return None
    return math.inf if any(math.isinf(v) for v in present) else mean(present)


def summarize(rows: list[dict[str, Any]], extra: list[str]) -> list[dict[str, Any]]:
    """Mean over runs (seeds) that share every swept key; `extra` are the swept keys shown as their own columns."""
    axes = swept_keys(rows)
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[tuple(repr(row["config"].get(k)) for k in axes) + (row["label"], row["model"], row["data"])].append(row)
    table = []
    for members in groups.values():
        first = members[0]
        entry = {k: first[k] for k in ("label", "model", "data", "target_epsilon", "batch_size", "test_metric")}
        entry.update({k: first["config"].get(k) for k in extra})
        entry["series"] = ", ".join([first["label"], *(f"{k}={first['config'].get(k)}" for k in extra)])
        entry["projections"] = first["projections"]
        for column in ("epsilon", "test_value", "samples_per_s", "peak_memory_mb"):
            entry[column] = _mean([m[column] for m in members])
        entry["runs"] = len(members)
        table.append(entry)
    return sorted(table, key=lambda e: (e["model"] or "", e["data"] or "", e["label"], e["target_epsilon"] or 0,
                                        e["batch_size"] or 0))


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.4g}"
    return str(value)


def markdown(table: list[dict[str, Any]], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in table]
    return "\n".join(lines) + "\n"


def _plot_lines(table, x: str, y: str, xlabel: str, ylabel: str, path: Path, logy: bool = False) -> Path | None:
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for row in table:
        if row[x] is not None and row[y] is not None and math.isfinite(row[x]) and math.isfinite(row[y]):
            series[row["series"]].append((row[x], row[y]))
    if not series:
        return None
    figure, axes = plt.subplots(figsize=(6, 4))
    for label, points in sorted(series.items()):
        points.sort()
        axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    if logy:
        axes.set_yscale("log")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def _plot_throughput(table, path: Path) -> Path | None:
    speeds: dict[str, list[float]] = defaultdict(list)
    for row in table:
        if row["samples_per_s"] is not None:
            speeds[row["series"]].append(row["samples_per_s"])
    if not speeds:
        return None
    labels = sorted(speeds)
    figure, axes = plt.subplots(figsize=(6, 4))
    axes.bar(labels, [mean(speeds[label]) for label in labels])
    axes.set_ylabel("samples/s")
    axes.tick_params(axis="x", rotation=30)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def max_batch_markdown(directories: list[Path]) -> str:
    """Table of `python -m dpbench.profile max_batch` results found under the directories."""
    rows = []
    for directory in directories:
        for path in sorted(Path(directory).rglob("max_batch.json")):
            rows += json.loads(path.read_text())
    if not rows:
        return ""
    lines = ["", "Largest batch under a memory cap", "", "| privatizer | overrides | device | cap MB | max batch |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['privatizer']} | {' '.join(r.get('overrides', []))} | {r['device']} | {r['cap_mb']:g} | "
              f"{r['max_batch_size']} |" for r in rows]
    return "\n".join(lines) + "\n"


def build_report(directories: list[Path], out: Path | None = None) -> dict[str, Any]:
    """Write report.md, report.csv and plots into `out` (default: the first directory); return what was written."""
    rows = collect_results(directories)
    if not rows:
        raise FileNotFoundError(f"no results.json under {', '.join(map(str, directories))}")
    out = Path(out or directories[0])
    out.mkdir(parents=True, exist_ok=True)
    extra = [k for k in swept_keys(rows) if k not in SHOWN and not k.startswith("privatizer.")]
    table = summarize(rows, extra)
    columns = [*COLUMNS[:5], *extra, *COLUMNS[5:]]
    (out / "report.md").write_text(markdown(table, columns) + max_batch_markdown(directories))
    with (out / "report.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(table)
    metric = table[0]["test_metric"]
    plots = [
        _plot_lines(table, "epsilon", "test_value", "epsilon (spent)", f"test {metric}", out / "metric_vs_epsilon.png"),
        _plot_lines(table, "batch_size", "peak_memory_mb", "batch size", "peak memory (MB)",
                    out / "memory_vs_batch.png"),
        _plot_throughput(table, out / "samples_per_s.png"),
        _plot_lines([r for r in table if r["projections"] is not None], "projections", "epsilon",
                    "JL dimension r", "epsilon", out / "epsilon_vs_jl_dimension.png", logy=True),
    ]
    return {"rows": rows, "table": table, "columns": columns, "markdown": out / "report.md", "csv": out / "report.csv",
            "plots": [p for p in plots if p is not None]}
