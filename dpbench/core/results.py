"""results.json: written atomically, one per run directory; and the one-screen summary printed at the end."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from dpbench.core.methods import with_privatizer

RESULTS_FILE = "results.json"
REFUSED_FILE = "refused.json"
"""What a refused multirun job leaves in its directory (its overrides and the error), so the sweep goes on."""


def _json_safe(value: Any) -> Any:
    """Strict JSON: a non-finite float (an infinite epsilon) becomes the string "inf" / "-inf" / "nan"."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(item) for item in value]
    return value


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_json_safe(payload), indent=2, default=str, allow_nan=False))
    os.replace(tmp, path)


def read_results(run_dir: Path) -> dict[str, Any]:
    return json.loads((Path(run_dir) / RESULTS_FILE).read_text())


def _fmt(value: Any, spec: str = ".4g") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def _underreport(results: dict[str, Any]) -> str:
    """Where the reported epsilon is the privatizer's declared figure because its ledger composed less."""
    mark = results.get("ledger_underreported")
    if not mark:
        return ""
    return f" from the privatizer's composition(): its ledger under-reported {_fmt(mark['ledger_epsilon'])}"


def summary_text(results: dict[str, Any]) -> str:
    metric = results.get("test_metric", "accuracy")
    rows = [
        ("run", f"{with_privatizer(results.get('method', results['privatizer']), results['privatizer'])} | "
                f"{results['model']} | {results['data']} | {results['device']}"),
        (f"test {metric}", _fmt(results.get(f"test_{metric}"), ".4f")),
        ("epsilon (spent)", f"{_fmt(results['epsilon'])} at delta={_fmt(results['delta'])} "
                            f"[{results.get('accountant_method', '-')}]{_underreport(results)}"),
        ("noise multiplier", _fmt(results["noise_multiplier"])),
        ("clip norm", _fmt(results.get("clip_norm"))),
        ("sampling", f"{results['sampling']} q={_fmt(results['sampling_rate'])} "
                     f"batch={results['batch_size']} N={results['train_size']}"),
        ("steps / epochs", f"{results['steps']} / {results['epochs']}"),
        ("samples/s", _fmt(results["samples_per_s"], ".1f")),
        ("peak memory", f"{_fmt(results['peak_memory_mb'], '.1f')} MB ({results.get('memory_method', '')})"),
        ("train time", f"{_fmt(results.get('train_time_s'), '.1f')} s"),
        ("results", results.get("run_dir", "")),
    ]
    width = max(len(key) for key, _ in rows)
    line = "-" * 72
    return "\n".join([line, "dpbench run summary", line, *(f"{k:<{width}}  {v}" for k, v in rows), line])
