"""The leaderboard's figures: metric vs epsilon per method, and metric vs memory / time with the Pareto front."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dpbench.leaderboard.summary import Entry  # noqa: E402


def _axis_label(metric: str) -> str:
    return f"test {metric} ({'lower' if metric == 'loss' else 'higher'} is better)"


def draw_epsilon(axes, entries: list[Entry], title: str, delta: float) -> bool:
    """Mean +- std over seeds against epsilon, one line per variant; non-private as a dashed line."""
    lines: dict[str, list[Entry]] = defaultdict(list)
    metric = None
    for entry in entries:
        if entry.mean is None:
            continue
        metric = entry.metric
        if entry.epsilon is None:
            axes.axhline(entry.mean, color="black", linestyle="--", linewidth=1, label=entry.label)
        else:
            lines[entry.label].append(entry)
    for label, points in lines.items():
        points.sort(key=lambda e: e.epsilon)
        axes.errorbar([p.epsilon for p in points], [p.mean for p in points], yerr=[p.std or 0.0 for p in points],
                      marker="o", capsize=3, label=label)
    if metric is None:
        return False
    axes.set_xscale("log")
    budgets = sorted({e.epsilon for e in entries if e.epsilon is not None})
    axes.set_xticks(budgets, [f"{b:g}" for b in budgets])
    axes.minorticks_off()
    axes.ticklabel_format(axis="y", useOffset=False)
    axes.set_xlabel(f"epsilon (delta {delta:g})")
    axes.set_ylabel(_axis_label(metric))
    axes.set_title(title, fontsize=9)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7)
    return True


def pareto(points: list[tuple[float, float, str]], maximize: bool) -> list[tuple[float, float, str]]:
    """Points no other point beats on both cost (lower) and metric; sorted by cost."""
    front, best = [], None
    for point in sorted(points, key=lambda p: (p[0], -p[1] if maximize else p[1])):
        if best is None or (point[1] > best if maximize else point[1] < best):
            front.append(point)
            best = point[1]
    return front


def _draw_cost(axes, entries: list[Entry], cost: str, xlabel: str) -> bool:
    """Private methods as points, their Pareto front ringed and joined; non-private as a grey reference star."""
    measured = [e for e in entries if e.mean is not None and e.cost(cost) is not None]
    if not measured:
        return False
    metric = measured[0].metric
    points = [(e.cost(cost), e.mean, e.label) for e in measured if e.epsilon is not None]
    for entry in measured:
        if entry.epsilon is None:
            axes.scatter([entry.cost(cost)], [entry.mean], marker="*", s=120, color="grey", zorder=3)
            axes.annotate(entry.label, (entry.cost(cost), entry.mean), fontsize=7, xytext=(3, 3),
                          textcoords="offset points")
    for x, y, label in points:
        axes.scatter([x], [y], zorder=3)
        axes.annotate(label, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    front = pareto(points, maximize=metric != "loss")
    if front:
        axes.scatter([p[0] for p in front], [p[1] for p in front], s=160, facecolors="none", edgecolors="red",
                     zorder=4)
        axes.step([p[0] for p in front], [p[1] for p in front], where="post", color="red", linewidth=1,
                  label="Pareto front (private methods)")
    axes.ticklabel_format(axis="y", useOffset=False)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(_axis_label(metric))
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7)
    return True


def epsilon_plot(entries: list[Entry], title: str, delta: float, path: Path) -> Path | None:
    figure, axes = plt.subplots(figsize=(6, 4))
    drawn = draw_epsilon(axes, entries, title, delta)
    return _save(figure, path) if drawn else _discard(figure)


def cost_plot(entries: list[Entry], epsilon: float, title: str, path: Path) -> Path | None:
    """At one budget: metric vs peak memory and vs time per step, Pareto fronts marked."""
    chosen = [e for e in entries if e.epsilon in (epsilon, None)]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    drawn = _draw_cost(left, chosen, "peak_mb", "peak memory (MB)")
    drawn = _draw_cost(right, chosen, "step_s", "wall time per training step (s)") and drawn
    figure.suptitle(f"{title}, epsilon {epsilon:g} (non-private included)", fontsize=9)
    return _save(figure, path) if drawn else _discard(figure)


def headline_plot(panels: list[tuple[str, list[Entry], float]], path: Path) -> Path | None:
    """Every task's metric-vs-epsilon panel (title, entries, delta) in one figure (the README's picture)."""
    panels = [panel for panel in panels if any(e.mean is not None for e in panel[1])]
    if not panels:
        return None
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    figure, grid = plt.subplots(rows, columns, figsize=(5.5 * columns, 4 * rows), squeeze=False)
    for axes, (title, entries, delta) in zip(grid.flat, panels, strict=False):
        draw_epsilon(axes, entries, title, delta)
    for axes in list(grid.flat)[len(panels):]:
        axes.set_visible(False)
    return _save(figure, path)


def _save(figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _discard(figure) -> None:
    plt.close(figure)
