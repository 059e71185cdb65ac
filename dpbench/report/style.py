"""What every report and leaderboard figure shares so that a paper can take it as it is: each method's colour and
marker (dpbench.core.method_style), legends of at most ten rows a column, tick labels that never overlap, a y view
that neither zooms into one point's noise nor is stretched by a run that learned nothing, and the level of a model
that learned nothing (chance accuracy, a constant prediction's loss) drawn where the task names it."""

from __future__ import annotations

import math
from collections.abc import Sequence

from matplotlib.axes import Axes
from matplotlib.ticker import LogLocator, MaxNLocator, ScalarFormatter

from dpbench.core.method_style import legend_columns

TICKS = 5
"""At most this many ticks on a linear axis (six-digit labels such as 0.0025 fit five to a panel)."""
LOG_RATIO = 30.0
"""Positive values whose largest is this many times their smallest go on a log axis: a linear one would crowd them
into its first tick."""
MIN_SPAN = {"accuracy": 0.1}
"""The narrowest y view of a metric: ten points of accuracy; other metrics 10% of their largest magnitude."""
RELATIVE_SPAN = 0.1
PAD = 0.05
"""The share of the view left free above and below the data."""
REFERENCE = {"accuracy": "chance", "loss": "constant prediction"}
"""How the level of a model that learned nothing is named, by metric."""
EDGE_NOTE = "open markers on the axis edge: runs at or {where} {name}{level}, {where} the axis"


def legend_outside(target, handles: Sequence | None = None, labels: Sequence[str] | None = None,
                   fontsize: float = 7) -> None:
    """A legend to the right of the axes (or figure) `target`, split into columns of at most
    dpbench.core.method_style.LEGEND_ROWS."""
    if handles is None or labels is None:
        handles, labels = target.get_legend_handles_labels()
    if labels:
        target.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
                      fontsize=fontsize, frameon=False, ncol=legend_columns(len(labels)))


def readable_axis(axes: Axes, which: str, values: Sequence[float]) -> None:
    """Tick labels that never overlap: positive values spanning more than LOG_RATIO go on a log axis with one label
    a decade, others on a linear axis of at most TICKS ticks, written out in full (no offset)."""
    axis = axes.xaxis if which == "x" else axes.yaxis
    finite = [v for v in values if math.isfinite(v)]
    if finite and min(finite) > 0 and max(finite) / min(finite) > LOG_RATIO:
        (axes.set_xscale if which == "x" else axes.set_yscale)("log")
        axis.set_major_locator(LogLocator(base=10, numticks=TICKS + 2))
        return
    linear_ticks(axis)


def linear_ticks(axis) -> None:
    """At most TICKS ticks at round steps, each label the full value (no offset that a reader must add back)."""
    axis.set_major_locator(MaxNLocator(nbins=TICKS, steps=[1, 2, 2.5, 5, 10]))
    formatter = ScalarFormatter(useOffset=False)
    formatter.set_powerlimits((-4, 6))
    axis.set_major_formatter(formatter)


def _min_span(metric: str | None, values: Sequence[float]) -> float:
    return MIN_SPAN.get(metric or "", RELATIVE_SPAN * max(abs(v) for v in values)) or 1.0


def y_view(values: Sequence[float], metric: str | None, reference: float | None = None) -> tuple[float, float]:
    """The y limits a panel shows. The rule: the view spans `values` (the means and interval ends of the runs that
    learned, the ceilings and published figures), and the task's reference level (chance, a constant prediction's
    loss) where taking it in at most doubles that span; it is at least MIN_SPAN wide around the data's centre (one
    point, or results within a point of each other, are not zoomed into their noise), padded by PAD each side, and
    within 0-1 for an accuracy. A run at the reference level far from the rest is drawn on the axis edge instead
    (mark_off_view)."""
    low, high = min(values), max(values)
    if reference is not None and max(high, reference) - min(low, reference) <= 2 * max(high - low,
                                                                                        _min_span(metric, values)):
        low, high = min(low, reference), max(high, reference)
    span = max(high - low, _min_span(metric, values))
    centre = (low + high) / 2
    low, high = centre - span / 2 - PAD * span, centre + span / 2 + PAD * span
    return _shift_into_unit(low, high) if metric == "accuracy" else (low, high)


def _shift_into_unit(low: float, high: float) -> tuple[float, float]:
    """The same span moved to lie within 0-1 where it fits, else clipped to 0-1."""
    shift = max(0.0, -low) - max(0.0, high - 1.0)
    return max(0.0, low + shift), min(1.0, high + shift)


def draw_reference(axes: Axes, level: float | None, metric: str | None) -> None:
    """The level of a model that learned nothing, as a black dashed line named for the metric (chance accuracy,
    a constant prediction's loss), where the task names one: in the view, or, where taking it in would squash the
    runs (y_view), written on the edge it lies beyond."""
    if level is None or metric not in REFERENCE:
        return
    low, high = axes.get_ylim()
    if low <= level <= high:
        axes.axhline(level, color="black", linestyle="--", linewidth=0.9, label=REFERENCE[metric], zorder=1)
        return
    below = level < low
    shown = f"{100 * level:.1f}%" if metric == "accuracy" else f"{level:.3g}"
    axes.text(0.99, 0.02 if below else 0.98, f"{REFERENCE[metric]} {shown}: {'below' if below else 'above'} the axis",
              transform=axes.transAxes, fontsize=6, color="black", ha="right", va="bottom" if below else "top",
              gid="reference_off_view")


def mark_off_view(axes: Axes, points: Sequence[tuple[float, float, object, str]], metric: str | None,
                  level: float | None = None) -> None:
    """(x, y, colour, marker) points outside the y view drawn as open markers on the edge they lie beyond, with a
    note naming the `level` they sit near: a run that learned nothing stays visible without stretching the axis."""
    low, high = axes.get_ylim()
    off = [(x, low if y < low else high, colour, marker) for x, y, colour, marker in points if not low <= y <= high]
    for x, y, colour, marker in off:
        axes.plot([x], [y], marker=marker, markerfacecolor="none", markeredgecolor=colour, linestyle="none",
                  clip_on=False, zorder=4, gid="off_view")
    if off:
        below = off[0][1] == low
        for text in [t for t in axes.texts if t.get_gid() == "reference_off_view"]:
            text.remove()  # the note below names the level the runs sit near: one note on that edge, not two
        name = REFERENCE.get(metric or "", "the reference level")
        shown = "" if level is None else f" ({100 * level:.1f}%)" if metric == "accuracy" else f" ({level:.3g})"
        axes.text(0.01, 0.02 if below else 0.98, EDGE_NOTE.format(name=name, level=shown,
                                                                 where="below" if below else "above"),
                  transform=axes.transAxes, fontsize=6, color="dimgray", va="bottom" if below else "top")
