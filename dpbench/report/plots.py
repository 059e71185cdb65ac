"""The report's figures, built from its table (one entry per distinct configuration, see build.summarize).

A figure never merges configurations silently: a line joins only entries that differ in its x axis alone, a bar is
one configuration, and every line or bar is labelled with what sets it apart from the others.
"""

from __future__ import annotations

import math
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from dpbench.report.collect import VARIANT_KEYS  # noqa: E402

SHORT = {"privacy.epsilon": "ε", "privacy.noise_multiplier": "σ", "batch_size": "B"}
# What sets the spent epsilon: a line of the metric-vs-epsilon plot runs along these.
EPSILON_KEYS = {"privacy.epsilon", "privacy.noise_multiplier"}
LABEL_WIDTH = 48  # characters per line of a bar label before it wraps


def _short(key: str) -> str:
    return SHORT.get(key, key.removesuffix(".name"))


def _value(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def distinguishing_keys(table: list[dict[str, Any]]) -> list[str]:
    """Swept keys that tell entries apart: privatizer keys only where they vary under one privatizer name (keys
    that exist for one privatizer and not another say nothing the privatizer's name does not)."""
    keys = sorted({k for entry in table for k in entry["axes"]})
    by_name: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for entry in table:
        by_name[entry["config"].get("privatizer.name", entry["label"])].append(entry)
    shown = []
    for key in keys:
        if key == "privatizer.name" or key.removeprefix("privatizer.") in VARIANT_KEYS:
            continue  # in the privatizer's label
        if key.startswith("privatizer.") and all(
                len({repr(e["config"].get(key)) for e in group}) < 2 for group in by_name.values()):
            continue
        shown.append(key)
    return shown


def describe(entry: dict[str, Any], keys: list[str], exclude: set[str] = frozenset()) -> str:
    """'jl(r=5), ε=3, B=256': the privatizer with its variant keys, then each distinguishing key not excluded.
    A non-private entry shows no privacy.* key: none of them changes what it trains."""
    config = entry["config"]
    name = config.get("privatizer.name")
    if name is None:
        head = entry["label"]
    else:
        variants = [f"{short}={_value(config[f'privatizer.{key}'])}" for key, short in VARIANT_KEYS.items()
                    if config.get(f"privatizer.{key}") is not None and f"privatizer.{key}" not in exclude]
        head = f"{name}({', '.join(variants)})" if variants else str(name)
    parts = [head]
    for key in keys:
        if key in exclude or (not entry["private"] and key.startswith("privacy.")):
            continue
        parts.append(f"{_short(key)}={_value(config.get(key))}")
    return ", ".join(parts)


def _finite(value: Any) -> bool:
    return value is not None and math.isfinite(value)


def line_series(table: list[dict[str, Any]], x: str, y: str, exclude: set[str],
                private_only: bool = False) -> dict[str, list[tuple]]:
    """Points (x, y) per line; a line is every entry with the same description once `exclude` (the keys that move
    an entry along x) is left out."""
    keys = distinguishing_keys(table)
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for entry in table:
        if (entry["private"] or not private_only) and _finite(entry[x]) and _finite(entry[y]):
            series[describe(entry, keys, exclude)].append((entry[x], entry[y]))
    return {label: sorted(points) for label, points in sorted(series.items())}


def nonprivate_baselines(table: list[dict[str, Any]]) -> dict[str, float]:
    """Test metric of each non-private configuration: the ceiling the private lines are read against."""
    keys = distinguishing_keys(table)
    return {describe(e, keys, EPSILON_KEYS): e["test_value"] for e in table
            if not e["private"] and _finite(e["test_value"])}


def throughput_bars(table: list[dict[str, Any]]) -> list[tuple[str, float]]:
    """One bar per configuration (never a mean over epsilons or batch sizes), in table order."""
    keys = distinguishing_keys(table)
    return [(describe(e, keys), e["samples_per_s"]) for e in table if _finite(e["samples_per_s"])]


def draw_lines(series: dict[str, list[tuple]], xlabel: str, ylabel: str, baselines: dict[str, float] | None = None,
               logy: bool = False) -> Figure:
    figure, axes = plt.subplots(figsize=(6, 4))
    for label, points in series.items():
        axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    for label, value in (baselines or {}).items():
        axes.axhline(value, linestyle="--", color="gray", label=f"{label} (no privacy)")
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    if logy:
        axes.set_yscale("log")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    return figure


def draw_bars(bars: list[tuple[str, float]], xlabel: str) -> Figure:
    """Horizontal bars: labels read left to right at any length, and the figure grows with them."""
    labels = [textwrap.fill(label, LABEL_WIDTH, break_long_words=False) for label, _ in bars]
    lines = sum(label.count("\n") + 1 for label in labels)
    widest = max((len(line) for label in labels for line in label.splitlines()), default=0)
    figure, axes = plt.subplots(figsize=(4.5 + 0.075 * widest, 1.2 + 0.32 * lines))
    container = axes.barh(range(len(bars)), [value for _, value in bars])
    axes.set_yticks(range(len(bars)), labels, fontsize=8)
    axes.invert_yaxis()
    axes.bar_label(container, fmt="%.4g", fontsize=8, padding=2)
    axes.margins(x=0.15)
    axes.set_xlabel(xlabel)
    axes.grid(axis="x", alpha=0.3)
    figure.tight_layout()
    return figure


def report_figures(table: list[dict[str, Any]]) -> dict[str, Figure]:
    """File name -> figure for each plot the table has data for; the caller saves and closes them."""
    figures = {}
    metric = table[0]["test_metric"] if table else "metric"
    accuracy = line_series(table, "epsilon", "test_value", EPSILON_KEYS, private_only=True)
    baselines = nonprivate_baselines(table)
    if accuracy or baselines:
        figures["metric_vs_epsilon.png"] = draw_lines(accuracy, "epsilon (spent)", f"test {metric}", baselines)
    memory = line_series(table, "batch_size", "peak_memory_mb", {"batch_size"})
    if memory:
        figures["memory_vs_batch.png"] = draw_lines(memory, "batch size", "peak memory (MB)")
    bars = throughput_bars(table)
    if bars:
        figures["samples_per_s.png"] = draw_bars(bars, "samples/s")
    jl = line_series(table, "projections", "epsilon", {"privatizer.projections"})
    if jl:
        figures["epsilon_vs_jl_dimension.png"] = draw_lines(jl, "JL dimension r", "epsilon", logy=True)
    return figures


def save_figure(figure: Figure, path: Path) -> Path:
    """PNG at the figure's own size, grown to hold a legend placed outside the axes; the figure is closed."""
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return path
