"""Find results.json files under run or sweep directories and flatten them into table rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dpbench.methods import method_label

# Strategy keys that distinguish variants of one privatizer in tables and plot legends.
VARIANT_KEYS = {
    "projections": "r",
    "rank": "rank",
    "update_every": "F",
    "dim": "p",
    "noise_decay": "decay",
    "selection": "sel",
    "sparsity": "s",
}


def _number(value: Any) -> float | None:
    """results.json stores an infinite epsilon as the string 'inf'."""
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def label_of(result: dict[str, Any]) -> str:
    """The method with its optimizer plus the keys that make it a variant, e.g. 'DP-SGD-JL (r=5)'."""
    config = result.get("config", {}) or {}
    privatizer = config.get("privatizer", {}) or {}
    parts = [f"{short}={privatizer[key]}" for key, short in VARIANT_KEYS.items() if privatizer.get(key) is not None]
    name = privatizer.get("name", result.get("privatizer", "?"))
    optimizer = (config.get("optimizer") or {}).get("name")
    method = method_label(name, optimizer) if optimizer else name  # a results.json that does not record it
    return f"{method} ({', '.join(parts)})" if parts else method


def row_of(result: dict[str, Any], path: Path) -> dict[str, Any]:
    metric = result.get("test_metric", "accuracy")
    privatizer = result.get("config", {}).get("privatizer", {}) or {}
    return {
        "label": label_of(result),
        "privatizer": result.get("privatizer"),
        "private": result.get("private", result.get("privatizer") != "nonprivate"),
        "model": result.get("model"),
        "data": result.get("data"),
        "epsilon": _number(result.get("epsilon")),
        "target_epsilon": _number(result.get("target_epsilon")),
        "delta": result.get("delta"),
        "noise_multiplier": _number(result.get("noise_multiplier")),
        "batch_size": result.get("batch_size"),
        "steps": result.get("steps"),
        "test_metric": metric,
        "test_value": _number(result.get(f"test_{metric}")),
        "samples_per_s": _number(result.get("samples_per_s")),
        "peak_memory_mb": _number(result.get("peak_memory_mb")),
        "projections": privatizer.get("projections"),
        "seed": result.get("seed"),
        "device": result.get("device"),
        "path": str(path.parent),
        "config": flatten(result.get("config", {})),
    }


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists become tuples so they can be compared and grouped."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = tuple(value) if isinstance(value, list) else value
    return flat


# Keys that differ between runs without making them different configurations.
NOT_SWEPT = {"seed", "hydra", "logger.group", "logger.tags", "experiment_name", "resume"}


def swept_keys(rows: list[dict[str, Any]]) -> list[str]:
    """Config keys whose values differ across the runs (besides seeds): the sweep's axes."""
    keys = sorted({k for row in rows for k in row["config"]})
    varying = []
    for key in keys:
        if key in NOT_SWEPT or key.split(".")[0] in NOT_SWEPT:
            continue
        if len({repr(row["config"].get(key)) for row in rows}) > 1:
            varying.append(key)
    return varying


def collect_results(directories: list[Path]) -> list[dict[str, Any]]:
    """One row per results.json found (recursively) under the given run / sweep directories."""
    rows = []
    for directory in directories:
        directory = Path(directory)
        if not directory.exists():
            raise FileNotFoundError(f"no such run or sweep directory: {directory}")
        files = [directory] if directory.name == "results.json" else sorted(directory.rglob("results.json"))
        for path in files:
            result = json.loads(path.read_text())
            if "stopped" not in result:  # a run a failed per-sample check stopped: refused.json lists it
                rows.append(row_of(result, path))
    return rows
