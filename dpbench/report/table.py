"""The report's table: one entry per configuration (runs that differ only in their seeds), with the mean and 95%
interval over those seeds, as markdown and CSV."""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from dpbench.report.collect import configuration_of, swept_keys
from dpbench.report.stats import interval95, mean_of

HEAD = ("label", "optimizer", "model", "data", "parameters", "batch_size", "target_epsilon", "sigma", "steps")
TAIL = ("epsilon", "test_metric", "test_value", "test_value_ci95", "samples_per_s", "samples_per_s_ci95",
        "peak_memory_mb", "seeds")
# Swept keys already shown by the fixed columns (or by the label).
SHOWN = {"model.name", "data.name", "privatizer.name", "optimizer.name", "batch_size", "privacy.epsilon",
         "privacy.noise_multiplier"}
MEANS = {"epsilon": "epsilon", "sigma": "noise_multiplier", "steps": "steps", "test_value": "test_value",
         "samples_per_s": "samples_per_s", "peak_memory_mb": "peak_memory_mb"}
INTERVALS = ("test_value", "samples_per_s", "peak_memory_mb")  # the first two are columns
FIRST = ("label", "method", "optimizer", "model", "model_size", "parameters", "data", "target_epsilon", "batch_size",
         "test_metric", "private", "projections", "config")


BOUNDED_METRICS = ("accuracy",)
"""Test metrics that lie in [0, 1]; every other (a loss) and every cost is only non-negative."""


def value_range(column: str, row: dict[str, Any]) -> tuple[float | None, float | None]:
    if column == "test_value" and row.get("test_metric") in BOUNDED_METRICS:
        return 0.0, 1.0
    return 0.0, None


def _entry(members: list[dict[str, Any]], axes: list[str], extra: list[str]) -> dict[str, Any]:
    first = members[0]
    entry = {key: first[key] for key in FIRST}
    entry.update({key: first["config"].get(key) for key in extra})
    entry["axes"] = {key: first["config"].get(key) for key in axes}
    for column, field in MEANS.items():
        entry[column] = mean_of([member[field] for member in members])
    for column in INTERVALS:
        entry[f"{column}_ci95"] = interval95([member[column] for member in members], value_range(column, first))
    entry["samples_per_s_runs"] = [m["samples_per_s"] for m in members
                                   if m["samples_per_s"] is not None and math.isfinite(m["samples_per_s"])]
    entry["seeds"] = len(members)
    return entry


def summarize(rows: list[dict[str, Any]], extra: list[str]) -> list[dict[str, Any]]:
    """Mean and interval over the runs that share every config key but the seeds; `extra` are the swept keys shown
    as their own columns."""
    axes = swept_keys(rows)
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[configuration_of(row)].append(row)
    table = [_entry(members, axes, extra) for members in groups.values()]
    return sorted(table, key=lambda e: (str(e["model"]), str(e["model_size"]), str(e["data"]), e["label"],
                                        e["config"].get("privacy.epsilon") or 0, e["batch_size"] or 0,
                                        repr(sorted(e["axes"].items()))))


def tabulate(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The table (one entry per configuration) and its columns: the fixed ones plus the swept keys; the parameter
    count only where a results.json records it."""
    extra = [k for k in swept_keys(rows) if k not in SHOWN and not k.startswith("privatizer.")]
    head = [c for c in HEAD if c != "parameters" or any(row.get("parameters") for row in rows)]
    return summarize(rows, extra), [*head, *extra, *TAIL]


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.4g}"
    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, float) for v in value):
        return f"[{value[0]:.4g}, {value[1]:.4g}]"
    return str(value)


def _markdown_cell(entry: dict[str, Any], column: str) -> str:
    """A non-private run's target epsilon is shown as unused: it keeps such runs apart without claiming privacy."""
    target = entry["config"].get("privacy.epsilon")
    if column == "target_epsilon" and not entry["private"] and target is not None:
        return f"{_epsilon_cell(target)} (unused)"
    if column in EPSILONS:
        return _epsilon_cell(entry.get(column))
    return _cell(entry.get(column))


EPSILONS = ("epsilon", "target_epsilon")
"""Columns read side by side: one fixed number of decimals ("8.00", "7.96", "2.99"), never "8" beside "2.993"."""


def _epsilon_cell(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, int | float) and math.isfinite(value) else _cell(value)


def markdown(table: list[dict[str, Any]], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_markdown_cell(entry, c) for c in columns) + " |" for entry in table]
    note = ("\nMeans over the seeds of each configuration; *_ci95: Student-t 95% interval over them (- under two "
            "seeds). samples_per_s: one measurement per run (its steps after the warm-up), its interval over seeds.\n")
    return "\n".join(lines) + "\n" + note


def csv_columns(columns: list[str]) -> list[str]:
    """An interval column becomes two numeric ones, `_low` and `_high`."""
    return [part for c in columns for part in ((f"{c}_low", f"{c}_high") if c.endswith("_ci95") else (c,))]


def write_csv(table: list[dict[str, Any]], columns: list[str], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=csv_columns(columns), extrasaction="ignore")
        writer.writeheader()
        for entry in table:
            record = dict(entry)
            for column in columns:
                if column.endswith("_ci95"):
                    low, high = entry[column] or (None, None)
                    record.update({f"{column}_low": low, f"{column}_high": high})
            writer.writerow(record)
