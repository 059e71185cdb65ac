"""Comparison table and plots of a set of runs (mean over seeds of identical configurations)."""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from statistics import mean
from typing import Any

from dpbench.report.collect import collect_results, swept_keys
from dpbench.report.plots import report_figures, save_figure

COLUMNS = ("label", "model", "data", "batch_size", "target_epsilon", "epsilon", "test_metric", "test_value",
           "samples_per_s", "peak_memory_mb", "runs")
# Swept keys already shown by the fixed columns (or by the label).
SHOWN = {"model.name", "data.name", "privatizer.name", "optimizer.name", "batch_size", "privacy.epsilon"}


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    if not present:
        return None
    return math.inf if any(math.isinf(v) for v in present) else mean(present)


def _group_key(row: dict[str, Any], axes: list[str]) -> tuple:
    """A non-private run ignores every privacy.* key: its runs at several epsilons are one configuration."""
    keys = [k for k in axes if row["private"] or not k.startswith("privacy.")]
    return (tuple((k, repr(row["config"].get(k))) for k in keys), row["label"], row["model"], row["data"])


def summarize(rows: list[dict[str, Any]], extra: list[str]) -> list[dict[str, Any]]:
    """Mean over runs (seeds) that share every swept key; `extra` are the swept keys shown as their own columns."""
    axes = swept_keys(rows)
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[_group_key(row, axes)].append(row)
    table = []
    for members in groups.values():
        first = members[0]
        entry = {k: first[k] for k in ("label", "model", "data", "target_epsilon", "batch_size", "test_metric",
                                       "private", "projections", "config")}
        entry.update({k: first["config"].get(k) for k in extra})
        entry["series"] = ", ".join([first["label"], *(f"{k}={first['config'].get(k)}" for k in extra)])
        entry["axes"] = {k: first["config"].get(k) for k in axes if first["private"] or not k.startswith("privacy.")}
        for column in ("epsilon", "test_value", "samples_per_s", "peak_memory_mb"):
            entry[column] = _mean([m[column] for m in members])
        entry["runs"] = len(members)
        table.append(entry)
    return sorted(table, key=lambda e: (e["model"] or "", e["data"] or "", e["label"], e["target_epsilon"] or 0,
                                        e["batch_size"] or 0, repr(sorted(e["axes"].items()))))


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


def _footprint(row: dict[str, Any]) -> str:
    """Largest resident size a trial of this search had before its first step (older files do not record it)."""
    sizes = [t["setup_rss_mb"] for t in row.get("trials", []) if t.get("setup_rss_mb") is not None]
    return f"{max(sizes):.0f}" if sizes else "-"


def max_batch_markdown(directories: list[Path]) -> str:
    """Table of `python -m dpbench.profile max_batch` results found under the directories."""
    rows = []
    for directory in directories:
        for path in sorted(Path(directory).rglob("max_batch.json")):
            saved = json.loads(path.read_text())
            rows += saved["results"] if isinstance(saved, dict) else saved  # a list: written before the fields key
    if not rows:
        return ""
    lines = ["", "Largest batch under a memory cap (footprint: resident MB before the first step)", "",
             "| privatizer | overrides | device | cap MB | max batch | footprint MB | note |", "|---" * 7 + "|"]
    lines += [f"| {r['privatizer']} | {' '.join(r.get('overrides', []))} | {r['device']} | {r['cap_mb']:g} | "
              f"{r['max_batch_size']} | {_footprint(r)} | {r.get('note') or ''} |" for r in rows]
    return "\n".join(lines) + "\n"


def tabulate(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The report's table (one entry per configuration) and its columns: the fixed ones plus the swept keys."""
    extra = [k for k in swept_keys(rows) if k not in SHOWN and not k.startswith("privatizer.")]
    return summarize(rows, extra), [*COLUMNS[:5], *extra, *COLUMNS[5:]]


def default_out(directories: list[Path]) -> Path:
    """One directory: the report goes beside its runs. Several: a new directory of its own, so that no sweep's
    own report (written there by the sweep callback) is overwritten by a combined one."""
    if len(directories) == 1:
        directory = Path(directories[0])
        return directory.parent if directory.name == "results.json" else directory
    return Path("outputs") / "reports" / datetime.now().strftime("%Y-%m-%d_%H-%M-%S")


def build_report(directories: list[Path], out: Path | None = None) -> dict[str, Any]:
    """Write report.md, report.csv and plots into `out` (default: see default_out); return what was written."""
    rows = collect_results(directories)
    if not rows:
        raise FileNotFoundError(f"no results.json under {', '.join(map(str, directories))}")
    out = Path(out) if out is not None else default_out(directories)
    out.mkdir(parents=True, exist_ok=True)
    table, columns = tabulate(rows)
    (out / "report.md").write_text(markdown(table, columns) + max_batch_markdown(directories))
    with (out / "report.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(table)
    plots = []
    for name, figure in report_figures(table).items():
        plots.append(save_figure(figure, out / name))
    return {"rows": rows, "table": table, "columns": columns, "out": out, "markdown": out / "report.md",
            "csv": out / "report.csv", "plots": plots}
