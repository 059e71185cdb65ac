"""Write a report of a set of runs: the table (dpbench.report.table), its plots, and any max-batch results."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from dpbench.report.collect import collect_results
from dpbench.report.plots import remove_old_figures, report_figures, save_figure
from dpbench.report.table import markdown, tabulate, write_csv


def _footprint(row: dict[str, Any]) -> str:
    """Largest resident size a trial of this search had before its first step (older files do not record it)."""
    sizes = [t["setup_rss_mb"] for t in row.get("trials", []) if t.get("setup_rss_mb") is not None]
    return f"{max(sizes):.0f}" if sizes else "-"


def max_batch_markdown(directories: list[Path]) -> str:
    """Table of `python -m dpbench.capacity max_batch` results found under the directories."""
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
    write_csv(table, columns, out / "report.csv")
    remove_old_figures(out)
    plots = []
    for name, figure in report_figures(table).items():
        plots.append(save_figure(figure, out / name))
    return {"rows": rows, "table": table, "columns": columns, "out": out, "markdown": out / "report.md",
            "csv": out / "report.csv", "plots": plots}
