"""The frontier's figure, as in the GRAPE paper's Figure 3: peak memory against batch size, one line per method in
its colour and marker (dpbench.core.method_style), the cap drawn, and each method's first failing batch marked where
the line would cross it. The batch axis is labelled with the batch sizes tried, and the title says in words what
the Hydra overrides chose."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.ticker import FixedLocator, NullLocator, StrMethodFormatter  # noqa: E402

from dpbench.app.frontier import FrontierRow  # noqa: E402
from dpbench.core.method_style import legend_columns, style_of  # noqa: E402
from dpbench.core.methods import METHODS, method_label, preset_label  # noqa: E402

TITLE_WIDTH = 70
"""Characters a title line holds at the figure's width."""
FRONTIER_PLOT = "frontier.png"


def title_of(overrides: list[str]) -> str:
    """The model overrides a frontier names its model by ('model=opt model.size=1.3b'), as `plain_title` reads them."""
    return " ".join(o for o in overrides if o.startswith("model")) or "default model"


def optimizer_of(overrides: list[str]) -> str:
    """The trials' optimizer: the override, else the config's default."""
    return next((o.split("=", 1)[1] for o in overrides if o.startswith("optimizer=")), "sgd")


def plain_title(title: str) -> str:
    """'model=opt model.size=1.3b (CPU)' -> 'opt (size 1.3b) on CPU: peak memory vs batch size': the overrides a
    caller names its model by, read as words; a title without overrides is kept."""
    words, _, device = title.rpartition(" (") if title.endswith(")") else (title, "", "")
    device = device.removesuffix(")")
    model, details = "", []
    for token in words.split():
        key, equals, value = token.partition("=")
        if not equals:
            model = f"{model} {token}".strip()
        elif key.lstrip("+").split(".")[-1] == key.lstrip("+"):
            model = f"{model} {value}".strip()
        else:
            details.append(f"{key.split('.')[-1].replace('_', ' ')} {value}")
    name = model + (f" ({', '.join(details)})" if details else "")
    return f"{name}{f' on {device}' if device else ''}: peak memory vs batch size"


def _method(privatizer: str, optimizer: str | None) -> str:
    """The label a method's colour is keyed by: a built-in method's own label ('vanilla' is plain DP-Adam, as in
    the leaderboard), a preset's otherwise ('DP-Adam (materialized per-sample gradients)', 'DP-Adam-JL (r=5)')."""
    return method_label(privatizer, optimizer) if privatizer in METHODS else preset_label(privatizer, optimizer)


def _batch_axis(axes: Axes, batches: list[int]) -> None:
    """A log2 batch axis whose ticks are the batch sizes tried, written as integers (not 2^k), one if one was."""
    if not batches:  # refusals alone: nothing to place on a batch axis
        return
    axes.set_xscale("log", base=2)
    axes.xaxis.set_major_locator(FixedLocator(sorted(set(batches))))
    axes.xaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
    axes.xaxis.set_minor_locator(NullLocator())
    low, high = min(batches), max(batches)
    axes.set_xlim(low / 1.5, high * 1.5)


def plot_frontier(rows: list[FrontierRow], cap_mb: float, title: str, path: Path, optimizer: str | None) -> Path:
    figure, axes = plt.subplots(figsize=(6.0, 4.0), layout="constrained")
    for row in rows:
        fitted = sorted((t.batch_size, t.peak_mb) for t in row.trials if t.fits and t.peak_mb)
        failed = sorted(t.batch_size for t in row.trials if not t.fits)
        status = " (refused)" if row.refused else " (OOM at batch 1)" if row.out_of_memory_at_1 else ""
        style = style_of(_method(row.privatizer, optimizer))
        sharded = f" (FSDP2 over {row.devices}, per rank)" if row.devices > 1 else ""
        axes.plot([b for b, _ in fitted], [m / 1024 for _, m in fitted], marker=style.marker, color=style.colour,
                  linestyle="--" if row.devices > 1 else "-",
                  label=preset_label(row.privatizer, optimizer) + sharded + status)
        if failed:
            axes.plot([failed[0]], [cap_mb / 1024], marker="x", markersize=9, color=style.colour, linestyle="none")
    axes.axhline(cap_mb / 1024, color="black", linestyle="--", linewidth=1, label=f"cap {cap_mb / 1024:g} GiB")
    _batch_axis(axes, [t.batch_size for row in rows for t in row.trials])
    axes.set_xlabel("batch size (x: first batch out of memory)")
    axes.set_ylabel("peak memory (GiB)")
    axes.set_title(textwrap.fill(plain_title(title), TITLE_WIDTH, break_on_hyphens=False), fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small", ncol=legend_columns(len(axes.get_legend_handles_labels()[1])))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=150)
    plt.close(figure)
    return path


def replot(record: Path) -> Path:
    """The figure of a frontier.json written by `python -m dpbench.capacity frontier`, drawn again beside it with
    this module's styles: a record outlives the code that first plotted it."""
    data = json.loads(record.read_text())
    rows = [FrontierRow.from_dict(row) for row in data["rows"]]
    return plot_frontier(rows, data["cap_mb"], f"{title_of(data['overrides'])} ({data['device_name']})",
                         record.parent / FRONTIER_PLOT, optimizer_of(data["overrides"]))
