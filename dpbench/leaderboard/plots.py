"""The leaderboard's figures: metric vs epsilon per method, and metric vs memory / time with a Pareto front.

Every method keeps one colour and marker in every figure (dpbench.core.method_style, keyed by its label), non-private
baselines included (a dashed line, a star), so that two of them in one task stay apart; error bars are the 95%
interval over seeds; legends sit outside the axes, ten entries a column. Where the task names the level of a model
that learned nothing (its `chance`), it is drawn, and a run at that level neither stretches the y axis (it sits on the
axis edge, dpbench.report.style.y_view) nor joins a Pareto front. A Pareto front is drawn only where it separates
points by more than the measurement spread: one point dominates another only when it is cheaper by more than both
points' spread of that cost over their seeds (each seed repeats the cell's cost measurement) and no worse on the
metric; a front that dominates nothing is not drawn.
"""

from __future__ import annotations

import textwrap
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.container import ErrorbarContainer  # noqa: E402

from dpbench.core.method_style import legend_columns, style_of  # noqa: E402
from dpbench.leaderboard.claims import learned  # noqa: E402
from dpbench.leaderboard.summary import Entry  # noqa: E402
from dpbench.report.style import (  # noqa: E402
    PAD,
    draw_reference,
    legend_outside,
    linear_ticks,
    mark_off_view,
    readable_axis,
    y_view,
)

TITLE_WIDTH = 60
"""Characters a line of a panel's title holds: longer task titles ran into their neighbours in the headline figure."""


def _axis_label(metric: str) -> str:
    return f"test {metric} ({'lower' if metric == 'loss' else 'higher'} is better)"


def _error(entries: list[Entry]) -> list[list[float]]:
    """Distances from each mean to its interval's ends (zero where fewer than two seeds give none)."""
    below = [e.mean - e.interval[0] if e.interval else 0.0 for e in entries]
    above = [e.interval[1] - e.mean if e.interval else 0.0 for e in entries]
    return [below, above]


PUBLISHED = "published figure (wide dash, in its method's colour)"
Published = tuple[str, float, float]
"""A paper's number this task reproduces: (the method's label, which gives its style; epsilon; value)."""


def _draw_published(axes, published: list[Published]) -> None:
    for label, epsilon, value in published:
        axes.plot([epsilon], [value], linestyle="none", marker="_", markersize=28, markeredgewidth=3, gid="published",
                  color=style_of(label).colour, label="_nolegend_")
    if published:  # the legend's handle: a short thick line (the dash itself would overflow it)
        axes.plot([], [], color="black", linewidth=3, label=PUBLISHED)


def _levels(entry: Entry) -> list[float]:
    """Where the entry's point and whisker reach on the metric axis."""
    return [entry.mean, *(entry.interval or ())]


NEAR_CHANCE = 0.05
"""An accuracy within five points of chance is set aside from the y view (an open marker on the axis edge where the
rest lies far above): over a few seeds its interval usually reaches chance. Verdicts and Pareto fronts keep
dpbench.leaderboard.claims.learned's one point."""


def _near_chance(entry: Entry, chance: float | None) -> bool:
    return chance is not None and entry.metric == "accuracy" and entry.mean <= chance + NEAR_CHANCE


def _view(axes, entries: list[Entry], metric: str | None, chance: float | None, extra: list[float]) -> None:
    """The y view of the private runs above chance (every run where none is), the ceilings and `extra` levels, with
    the chance or constant-prediction line (dpbench.report.style.y_view's rule)."""
    shown = [e for e in entries if e.mean is not None]
    learning = [e for e in shown if e.epsilon is not None and not _near_chance(e, chance)]
    kept = [e for e in shown if e.epsilon is None] + learning if learning else shown
    axes.set_ylim(*y_view([level for e in kept for level in _levels(e)] + extra, metric, chance))
    linear_ticks(axes.yaxis)
    draw_reference(axes, chance, metric)


def draw_epsilon(axes, entries: list[Entry], title: str, delta: float, legend: bool = True,
                 published: list[Published] | None = None, chance: float | None = None, total: bool = False) -> bool:
    """Mean and 95% interval over seeds against epsilon, one line per variant; non-private as a dashed line; the
    papers' figures that the task reproduces as wide dashes at their level (every filled marker is a method's); the
    task's chance accuracy or constant prediction's loss as a black dashed line, and a run at that level far below
    the rest as an open marker on the axis edge."""
    lines: dict[str, list[Entry]] = defaultdict(list)
    metric = None
    for entry in entries:
        if entry.mean is None:
            continue
        metric = entry.metric
        if entry.epsilon is None:
            axes.axhline(entry.mean, color=style_of(entry.label).colour, linestyle="--", linewidth=1, label=entry.label)
        else:
            lines[entry.label].append(entry)
    for label, points in lines.items():
        points.sort(key=lambda e: e.epsilon)
        style = style_of(label)
        axes.errorbar([p.epsilon for p in points], [p.mean for p in points], yerr=_error(points),
                      marker=style.marker, color=style.colour, capsize=3, label=label)
    if metric is None:
        return False
    _draw_published(axes, published or [])
    axes.set_xscale("log")
    budgets = sorted({e.epsilon for e in entries if e.epsilon is not None})
    axes.set_xticks(budgets, [f"{b:.3g}" for b in budgets])
    axes.minorticks_off()
    _view(axes, entries, metric, chance, [value for _, _, value in published or []])
    mark_off_view(axes, [(p.epsilon, p.mean, style_of(label).colour, style_of(label).marker)
                         for label, points in lines.items() for p in points], metric, chance)
    axes.set_xlabel(("total epsilon, tuning included" if total else "epsilon") + f" (delta {delta:g})")
    axes.set_ylabel(_axis_label(metric))
    axes.set_title(textwrap.fill(title, TITLE_WIDTH, break_on_hyphens=False), fontsize=9)
    axes.grid(alpha=0.3)
    if legend:
        legend_outside(axes)
    return True


def spread(entry: Entry, cost: str) -> float:
    """The range of a cost over the entry's seeds: how much repeating the same cell moves it."""
    values = getattr(entry, cost)
    return max(values) - min(values) if len(values) > 1 else 0.0


def _cost_range(entry: Entry, cost: str) -> list[list[float]]:
    values, centre = getattr(entry, cost), entry.cost(cost)
    return [[centre - min(values)], [max(values) - centre]]


def pareto(points: list[tuple], maximize: bool) -> list[tuple]:
    """(cost, metric, label, cost spread[, metric interval]) points that no other point dominates, sorted by cost; a
    point dominates another when it is cheaper by more than the larger of their cost spreads and the other is not
    better beyond the metric's intervals (a costlier point stays on the front only where its metric is clearly
    better: JL r = 10 at 75.9% [72.6, 79.2] is not, over DP2-SGD's 71.4% [68.5, 74.3]). Without an interval the
    metric is its point value."""

    def bounds(point: tuple) -> tuple[float, float]:
        return point[4] if len(point) > 4 and point[4] is not None else (point[1], point[1])

    def clearly_better(b: tuple, a: tuple) -> bool:
        return bounds(b)[0] > bounds(a)[1] if maximize else bounds(b)[1] < bounds(a)[0]

    def dominates(a: tuple, b: tuple) -> bool:
        return not clearly_better(b, a) and b[0] - a[0] > max(a[3], b[3])

    return sorted((p for p in points if not any(dominates(q, p) for q in points if q is not p)), key=lambda p: p[0])


def front_levels(front: list[tuple], maximize: bool) -> list[float]:
    """The front's staircase: at each cost the best metric reached at that cost or less. Points within each other's
    spread all stay on the front, so joining their own metrics in cost order would draw the line at whichever came
    last, below a better point of about the same cost."""
    best = max if maximize else min
    levels: list[float] = []
    for point in front:
        levels.append(point[1] if not levels else best(levels[-1], point[1]))
    return levels


def _cost_levels(entry: Entry, cost: str) -> list[float]:
    values = getattr(entry, cost)
    return [entry.cost(cost), *values] if values else [entry.cost(cost)]


COST_SPAN = 0.2
"""The narrowest cost view, as a share of the largest cost shown: costs within a few percent of each other (the
MiniLM head's 1.21-1.23 MB) are one cost, not a spread to zoom into."""


def _cost_view(levels: list[float]) -> tuple[float, float]:
    """The x limits of a linear cost axis: the levels, widened about their centre to at least COST_SPAN of the
    largest, never below zero."""
    low, high = min(levels), max(levels)
    span = max(high - low, COST_SPAN * high) * (1 + 2 * PAD)
    centre = (low + high) / 2
    return max(0.0, centre - span / 2), centre + span / 2


def _draw_cost(axes, entries: list[Entry], cost: str, xlabel: str, chance: float | None = None) -> bool:
    """Each method as its own marker with its interval; non-private as a star in its colour; the front only where it
    separates points by more than their spread, among the runs that learned (a run at chance is cheap because it
    learned nothing, and is on no front)."""
    measured = [e for e in entries if e.mean is not None and e.cost(cost) is not None]
    if not measured:
        return False
    metric = measured[0].metric
    for entry in measured:
        if entry.epsilon is None:
            axes.errorbar([entry.cost(cost)], [entry.mean], yerr=_error([entry]), marker="*", markersize=12,
                          color=style_of(entry.label).colour, linestyle="none", label=entry.label, zorder=3)
            continue
        style = style_of(entry.label)
        axes.errorbar([entry.cost(cost)], [entry.mean], yerr=_error([entry]), xerr=_cost_range(entry, cost),
                      marker=style.marker, color=style.colour, linestyle="none", capsize=3, label=entry.label,
                      zorder=3)
    points = [(e.cost(cost), e.mean, e.label, spread(e, cost), e.interval) for e in measured
              if e.epsilon is not None and learned(e, chance)]
    front = pareto(points, maximize=metric != "loss")
    if len(front) < len(points):
        axes.step([p[0] for p in front], front_levels(front, maximize=metric != "loss"), where="post", color="red",
                  linewidth=1, alpha=0.6, label="Pareto front (beyond the spread)")
    levels = [level for e in measured for level in _cost_levels(e, cost)]
    readable_axis(axes, "x", levels)
    if axes.get_xscale() == "linear":
        axes.set_xlim(*_cost_view(levels))
    _view(axes, measured, metric, chance, [])
    mark_off_view(axes, [(e.cost(cost), e.mean, style_of(e.label).colour, style_of(e.label).marker)
                         for e in measured if e.epsilon is not None], metric, chance)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(_axis_label(metric))
    axes.grid(alpha=0.3)
    return True


def epsilon_plot(entries: list[Entry], title: str, delta: float, path: Path,
                 published: list[Published] | None = None, chance: float | None = None,
                 total: bool = False) -> Path | None:
    """One task's metric-vs-epsilon figure, widened by each legend column past the first so the panel keeps its
    width."""
    figure, axes = plt.subplots(figsize=(7.5, 4))
    drawn = draw_epsilon(axes, entries, title, delta, published=published, chance=chance, total=total)
    figure.set_figwidth(7.5 + 2.5 * (legend_columns(len(axes.get_legend_handles_labels()[1])) - 1))
    return _save(figure, path) if drawn else _discard(figure)


def _handles(*axes) -> tuple[list, list[str]]:
    """Every legend entry of the panels, each label once; an error bar by its marker and line alone (its caps and
    whiskers would hide the marker that tells the methods apart)."""
    legend: dict[str, object] = {}
    for panel in axes:
        for handle, label in zip(*panel.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle[0] if isinstance(handle, ErrorbarContainer) else handle)
    return list(legend.values()), list(legend)


def cost_plot(entries: list[Entry], epsilon: float, title: str, path: Path,
              chance: float | None = None) -> Path | None:
    """At one budget: metric vs peak memory and vs time per step, one legend for both panels, outside them."""
    chosen = [e for e in entries if e.epsilon in (epsilon, None)]
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    drawn = _draw_cost(left, chosen, "peak_mb", "peak memory (MB)", chance)
    drawn = _draw_cost(right, chosen, "step_s", "time per training step (s)", chance) and drawn
    if not drawn:
        return _discard(figure)
    legend_outside(right, *_handles(left, right))
    figure.suptitle(textwrap.fill(f"{title}, epsilon {epsilon:g}: mean and 95% interval over seeds; cost: median "
                                  "over seeds, x whisker its range", 2 * TITLE_WIDTH, break_on_hyphens=False),
                    fontsize=9)
    return _save(figure, path)


Panel = tuple[str, list[Entry], float, list[Published], float | None, bool]
"""A task's panel of the headline figure: title, entries, delta, published figures, chance level (or None), and
whether its epsilon axis is a total budget (a run at its paper's noise is drawn at its own epsilon instead)."""


def headline_plot(panels: list[Panel], path: Path) -> Path | None:
    """Every task's metric-vs-epsilon panel in one figure, each with the legend of what it draws (one legend of
    every task's methods ran to 18 entries); a method keeps its colour and marker in every panel."""
    panels = [panel for panel in panels if any(e.mean is not None for e in panel[1])]
    if not panels:
        return None
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    figure, grid = plt.subplots(rows, columns, figsize=(8 * columns, 4 * rows), squeeze=False)
    for axes, (title, entries, delta, published, chance, total) in zip(grid.flat, panels, strict=False):
        draw_epsilon(axes, entries, title, delta, legend=False, published=published, chance=chance, total=total)
        legend_outside(axes, *_handles(axes))
    for axes in list(grid.flat)[len(panels):]:
        axes.set_visible(False)
    return _save(figure, path)


def _save(figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)
    return path


def _discard(figure) -> None:
    plt.close(figure)
