"""Find results.json files under run or sweep directories and flatten them into table rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dpbench.core.methods import method_label, with_variant
from dpbench.core.results import RunResults, read_results


def _number(value: Any) -> float | None:
    """results.json stores an infinite epsilon as the string 'inf'."""
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def optimizer_of(result: dict[str, Any]) -> str | None:
    return ((result.get("config") or {}).get("optimizer") or {}).get("name", result.get("optimizer"))


def method_of(result: dict[str, Any]) -> str:
    """The method with its optimizer, e.g. 'DP-SGD': what a figure's colour and marker stand for."""
    privatizer = ((result.get("config") or {}).get("privatizer") or {}).get("name", result.get("privatizer", "?"))
    optimizer = optimizer_of(result)
    return method_label(privatizer, optimizer) if optimizer else privatizer  # a results.json that does not record it


def label_of(result: dict[str, Any]) -> str:
    """The method with its optimizer plus the keys that make it a variant, e.g. 'DP-SGD-JL (r=5)'."""
    return with_variant(method_of(result), (result.get("config") or {}).get("privatizer") or {})


def row_of(result: dict[str, Any], path: Path) -> dict[str, Any]:
    metric = result.get("test_metric", "accuracy")
    privatizer = (result.get("config") or {}).get("privatizer", {}) or {}
    return {
        "label": label_of(result),
        "method": method_of(result),
        "optimizer": optimizer_of(result),
        "privatizer": result.get("privatizer"),
        "private": result.get("private", result.get("privatizer") != "nonprivate"),
        "model": result.get("model"),
        "model_size": ((result.get("config") or {}).get("model") or {}).get("size"),
        "parameters": result.get("parameters"),
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
        "config": flatten(result.get("config") or {}),
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


# Keys that differ between runs without making them different configurations: the seeds, and where a run is logged.
NOT_SWEPT = {"seed", "privacy.seed", "hydra", "logger.group", "logger.tags", "experiment_name", "resume"}


def unswept(key: str) -> bool:
    return key in NOT_SWEPT or key.split(".")[0] in NOT_SWEPT


def configuration_of(row: dict[str, Any]) -> tuple:
    """Every config key but the seeds: runs that share it are repeats of one configuration, and only they are
    averaged (a non-private run at another epsilon is another configuration, though it trains alike)."""
    keys = sorted(k for k in row["config"] if not unswept(k))
    return (tuple((k, repr(row["config"][k])) for k in keys), row["label"], row["model"], row["data"])


def swept_keys(rows: list[dict[str, Any]]) -> list[str]:
    """Config keys whose values differ across the runs (besides seeds): the sweep's axes."""
    keys = sorted({k for row in rows for k in row["config"]})
    varying = []
    for key in keys:
        if unswept(key):
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
            result = read_results(path)
            if isinstance(result, RunResults):  # a run a failed per-sample check stopped: refused.json lists it
                rows.append(row_of(result.to_json(), path))
    return rows
