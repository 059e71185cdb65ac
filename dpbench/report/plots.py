"""The report's figures, built from its table (one entry per configuration, see dpbench.report.table), one set per
task (model and data set), each titled with the task and its scale.

A figure never merges configurations: a line joins only entries that differ in its x axis alone, a bar is one
configuration, and every line or bar is labelled with its method and what else sets it apart. Each method keeps its
colour and marker (dpbench.core.method_style); points carry their 95% interval over seeds; legends hold ten entries a
column, tick labels do not overlap, and a metric's axis is not zoomed into one point (dpbench.report.style).
"""

from __future__ import annotations

import math
import textwrap
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.transforms import offset_copy  # noqa: E402

from dpbench.core.method_style import style_of  # noqa: E402
from dpbench.report.labels import Task, legend_of, task_of, task_slug, task_title  # noqa: E402
from dpbench.report.stats import interval95  # noqa: E402
from dpbench.report.style import legend_outside, linear_ticks, readable_axis, y_view  # noqa: E402

# What sets the spent epsilon: a line of the metric-vs-epsilon plot runs along these.
EPSILON_KEYS = frozenset({"privacy.epsilon", "privacy.noise_multiplier"})
FIGURES = ("metric_vs_epsilon", "memory_vs_batch", "samples_per_s", "epsilon_vs_jl_dimension")
LABEL_WIDTH = 48  # characters per line of a bar label before it wraps
LINESTYLES = ("-", "--", ":", "-.")  # several lines of one method (other batch sizes, learning rates, ...)
HATCHES = ("", "//", "..", "xx", "\\\\")
THROUGHPUT_NOTE = ("samples/s: bar = mean over seeds, whisker = 95% interval over seeds\n"
                   "(each run records one samples/s, over its steps after the warm-up)")


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    interval: tuple[float, float] | None


@dataclass(frozen=True)
class Series:
    label: str
    method: str
    points: list[Point]


@dataclass(frozen=True)
class Bar:
    label: str
    method: str
    value: float
    interval: tuple[float, float] | None
    seeds: int


def _finite(value: Any) -> bool:
    return value is not None and math.isfinite(value)


def line_series(entries: list[dict[str, Any]], x: str, y: str, exclude: frozenset[str],
                private_only: bool = False) -> list[Series]:
    """Points (x, y, interval of y) per line; a line is every entry with the same description once `exclude` (the
    keys that move an entry along x) is left out."""
    legend = legend_of(entries)
    lines: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for entry in entries:
        if (entry["private"] or not private_only) and _finite(entry[x]) and _finite(entry[y]):
            lines[legend.label(entry, exclude)].append(entry)
    return [Series(label, members[0]["method"],
                   sorted((Point(e[x], e[y], e.get(f"{y}_ci95")) for e in members), key=lambda p: p.x))
            for label, members in sorted(lines.items())]


def nonprivate_baselines(entries: list[dict[str, Any]]) -> list[Series]:
    """Test metric of each non-private configuration: the ceiling its task's private lines are read against."""
    legend = legend_of(entries)
    return [Series(legend.label(e), e["method"], [Point(math.nan, e["test_value"], e.get("test_value_ci95"))])
            for e in entries if not e["private"] and _finite(e["test_value"])]


def throughput_bars(entries: list[dict[str, Any]]) -> list[Bar]:
    """One bar per method configuration, pooled over the privacy budgets (epsilon and sigma do not change a step's
    cost) but never over batch sizes or models, in table order; the whisker is over every run pooled."""
    legend = legend_of(entries)
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for entry in entries:
        if _finite(entry["samples_per_s"]):
            groups[legend.label(entry, EPSILON_KEYS)].append(entry)
    bars = []
    for label, members in groups.items():
        runs = [value for member in members for value in member.get("samples_per_s_runs") or [member["samples_per_s"]]]
        bars.append(Bar(label, members[0]["method"], mean(runs), interval95(runs, (0.0, None)), len(runs)))
    return bars


def _repeat_index(methods: list[str]) -> list[int]:
    """0 for a method's first line or bar, 1 for its second, ...: what tells lines of one colour apart."""
    seen: dict[str, int] = defaultdict(int)
    index = []
    for method in methods:
        index.append(seen[method])
        seen[method] += 1
    return index


def _whiskers(axes: Axes, xs: list[float], ys: list[float], items: Sequence[Point | Bar], colour: Any,
              along_x: bool = False, transform: Any = None) -> None:
    """The 95% interval of each item that has one (an item of one seed has none, and gets no whisker)."""
    shown = [(x, y, item.interval) for x, y, item in zip(xs, ys, items, strict=True) if item.interval]
    if not shown:
        return
    below = [(x if along_x else y) - low for x, y, (low, _) in shown]
    above = [high - (x if along_x else y) for x, y, (_, high) in shown]
    axes.errorbar([x for x, _, _ in shown], [y for _, y, _ in shown], fmt="none", ecolor=colour, capsize=3,
                  **{"xerr" if along_x else "yerr": [below, above]}, **({"transform": transform} if transform else {}))


DODGE_POINTS = 4.0
"""How far apart (in points) the markers of lines that share an x are drawn."""


def _dodges(series: list[Series]) -> list[float]:
    """An x offset in points per line where lines share an x (every method at the same epsilon), so that their
    markers and whiskers sit side by side instead of on top of each other; the data keep their x."""
    xs = [p.x for line in series for p in line.points if math.isfinite(p.x)]
    if len(series) < 2 or len(xs) == len(set(xs)):
        return [0.0] * len(series)
    return [DODGE_POINTS * (index - (len(series) - 1) / 2) for index in range(len(series))]


def _axes(title: str, what: str, size: tuple[float, float] = (6, 4)) -> tuple[Figure, Axes]:
    figure, axes = plt.subplots(figsize=size)
    axes.set_title(f"{title}\n{what}", fontsize=10)
    return figure, axes


def _include(axes: Axes, series: Sequence[Series]) -> None:
    """Autoscale to the lines' points and whiskers: drawn through a shifted transform (the dodge), they do not
    widen the axes' data limits themselves, and a figure of dodged lines showed empty axes."""
    points = [(p.x, level) for line in series for p in line.points for level in (p.y, *(p.interval or ()))]
    if points:
        axes.update_datalim(points)
        axes.autoscale_view()


def _levels(lines: Sequence[Series]) -> list[float]:
    """Where the lines' points and whiskers reach on y."""
    return [level for line in lines for p in line.points for level in (p.y, *(p.interval or ()))]


def draw_lines(series: list[Series], title: str, xlabel: str, ylabel: str, baselines: Sequence[Series] = (),
               logy: bool = False, metric: str | None = None) -> Figure:
    """One line per series, its whiskers the 95% interval; `baselines` as horizontal lines. A `metric`'s y view
    follows dpbench.report.style.y_view (never zoomed into one point); other quantities are autoscaled."""
    spread = any(p.interval for line in [*series, *baselines] for p in line.points)
    figure, axes = _axes(title, f"{ylabel} vs {xlabel}" + (" (mean and 95% interval over seeds)" if spread else ""))
    offsets = _dodges(series)
    for line, repeat, offset in zip(series, _repeat_index([s.method for s in series]), offsets, strict=True):
        style = style_of(line.method)
        xs, ys = [p.x for p in line.points], [p.y for p in line.points]
        shifted = offset_copy(axes.transData, fig=figure, x=offset, units="points")  # drawn apart, data unchanged
        axes.plot(xs, ys, marker=style.marker, color=style.colour, linestyle=LINESTYLES[repeat % len(LINESTYLES)],
                  label=line.label, transform=shifted)
        _whiskers(axes, xs, ys, line.points, style.colour, transform=shifted)
    _include(axes, series)
    for baseline, repeat in zip(baselines, _repeat_index([b.method for b in baselines]), strict=True):
        style = style_of(baseline.method)
        (point,) = baseline.points
        axes.axhline(point.y, linestyle=LINESTYLES[1 + repeat % (len(LINESTYLES) - 1)], color=style.colour,
                     label=baseline.label)
        if point.interval:
            axes.axhspan(*point.interval, color=style.colour, alpha=0.1, linewidth=0)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    readable_axis(axes, "x", [p.x for line in series for p in line.points])
    if logy:
        axes.set_yscale("log")
    elif metric and (levels := _levels([*series, *baselines])):
        axes.set_ylim(*y_view(levels, metric))
        linear_ticks(axes.yaxis)
    axes.grid(alpha=0.3)
    legend_outside(axes, fontsize=8)
    return figure


def draw_bars(bars: list[Bar], title: str) -> Figure:
    """Horizontal bars in each method's colour: labels read left to right at any length, and the figure grows with
    them; each bar is annotated with its mean and number of seeds, after its whisker."""
    labels = [textwrap.fill(bar.label, LABEL_WIDTH, break_long_words=False) for bar in bars]
    lines = sum(label.count("\n") + 1 for label in labels)
    widest = max((len(line) for label in labels for line in label.splitlines()), default=0)
    figure, axes = _axes(title, "throughput", (5.5 + 0.075 * widest, 2.0 + 0.32 * lines))
    values = [bar.value for bar in bars]
    container = axes.barh(range(len(bars)), values, color=[style_of(bar.method).colour for bar in bars])
    _whiskers(axes, values, list(range(len(bars))), bars, "black", along_x=True)
    for patch, repeat in zip(container.patches, _repeat_index([bar.method for bar in bars]), strict=True):
        patch.set_hatch(HATCHES[repeat % len(HATCHES)])
    axes.set_yticks(range(len(bars)), labels, fontsize=8)
    axes.invert_yaxis()
    for index, bar in enumerate(bars):  # after the whisker, not under it
        end = bar.interval[1] if bar.interval else bar.value
        axes.annotate(f"{bar.value:.4g} (n={bar.seeds})", (end, index), xytext=(4, 0), textcoords="offset points",
                      va="center", fontsize=8)
    axes.margins(x=0.25)
    axes.set_xlim(left=0)  # an interval below zero samples/s is only the few seeds' wide t-interval
    linear_ticks(axes.xaxis)
    axes.set_xlabel(THROUGHPUT_NOTE, fontsize=8)
    axes.grid(axis="x", alpha=0.3)
    figure.tight_layout()
    return figure


def task_figures(title: str, entries: list[dict[str, Any]]) -> dict[str, Figure]:
    """Figure name -> figure for each plot this task has data for (memory and JL only when they vary)."""
    figures = {}
    metric = entries[0]["test_metric"]
    accuracy = line_series(entries, "epsilon", "test_value", EPSILON_KEYS, private_only=True)
    baselines = nonprivate_baselines(entries)
    if accuracy or baselines:
        figures["metric_vs_epsilon"] = draw_lines(accuracy, title, "epsilon (spent)", f"test {metric}", baselines,
                                                  metric=metric)
    if len({e["batch_size"] for e in entries if e["batch_size"] is not None}) > 1:
        memory = line_series(entries, "batch_size", "peak_memory_mb", frozenset({"batch_size"}))
        if memory:
            figures["memory_vs_batch"] = draw_lines(memory, title, "batch size", "peak memory (MB)")
    bars = throughput_bars(entries)
    if bars:
        figures["samples_per_s"] = draw_bars(bars, title)
    if len({e["projections"] for e in entries if _finite(e["projections"])}) > 1:
        jl = line_series(entries, "projections", "epsilon", frozenset({"privatizer.projections"}))
        figures["epsilon_vs_jl_dimension"] = draw_lines(jl, title, "JL dimension r", "epsilon", logy=True)
    return figures


def report_figures(table: list[dict[str, Any]]) -> dict[str, Figure]:
    """File name -> figure: one set per task, so each task's baseline stays on its own axes. A report of one task
    names them `metric_vs_epsilon.png`, ...; of several, `metric_vs_epsilon_<model>_<data>.png`, ..."""
    tasks: dict[Task, list[dict[str, Any]]] = defaultdict(list)
    for entry in table:
        tasks[task_of(entry)].append(entry)
    figures = {}
    for task, entries in tasks.items():
        suffix = "" if len(tasks) == 1 else f"_{task_slug(task)}"
        for name, figure in task_figures(task_title(task, entries), entries).items():
            figures[f"{name}{suffix}.png"] = figure
    return figures


def remove_old_figures(directory: Path) -> None:
    """A report's figures replace the previous report's, whose task names may differ: none is left to mislead."""
    for name in FIGURES:
        for path in directory.glob(f"{name}*.png"):
            path.unlink()


def save_figure(figure: Figure, path: Path) -> Path:
    """PNG at the figure's own size, grown to hold a legend placed outside the axes; the figure is closed."""
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return path
