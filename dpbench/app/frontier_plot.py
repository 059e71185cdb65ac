"""The frontier's figure, as in the GRAPE paper's Figure 3: peak memory against batch size, one line per method,
the cap drawn, and each method's first failing batch marked where the line would cross it."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dpbench.app.frontier import FrontierRow  # noqa: E402
from dpbench.core.methods import preset_label  # noqa: E402


def plot_frontier(rows: list[FrontierRow], cap_mb: float, title: str, path: Path, optimizer: str | None) -> Path:
    figure, axes = plt.subplots(figsize=(6.0, 4.0), layout="constrained")
    for row in rows:
        fitted = sorted((t.batch_size, t.peak_mb) for t in row.trials if t.fits and t.peak_mb)
        failed = sorted(t.batch_size for t in row.trials if not t.fits)
        status = " (refused)" if row.refused else " (OOM at batch 1)" if row.out_of_memory_at_1 else ""
        label = preset_label(row.privatizer, optimizer) + status
        line = axes.plot([b for b, _ in fitted], [m / 1024 for _, m in fitted], marker="o", label=label)
        color = line[0].get_color()
        if failed:
            axes.plot([failed[0]], [cap_mb / 1024], marker="x", markersize=9, color=color, linestyle="none")
    axes.axhline(cap_mb / 1024, color="black", linestyle="--", linewidth=1, label=f"cap {cap_mb / 1024:g} GiB")
    if any(row.trials for row in rows):
        axes.set_xscale("log", base=2)  # batch sizes; a plot of refusals alone has none
    axes.set_xlabel("batch size (x: first batch out of memory)")
    axes.set_ylabel("peak memory (GiB)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=150)
    plt.close(figure)
    return path
