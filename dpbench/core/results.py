"""results.json: the typed, versioned record of a run, written and read here only; and the one-screen summary.

Version 1 (dpbench 0.1) is flat JSON, one key per field below (documented field by field in
docs/configuration.md, checked by a test), plus `test_<metric>` and `validation_<metric>` named by the task's
metric and the privatizer's own figures (`PrivatizerStrategy.privacy_report`) beside them. A file without
`schema_version` was written before the schema: it is read with the fields it lacks as null, and its
`peak_memory_mb` on CPU is the resident peak (VmHWM), not the working set version 1 reports (`memory_method` says).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from dpbench.core.errors import ConfigurationError
from dpbench.core.methods import with_privatizer

RESULTS_FILE = "results.json"
REFUSED_FILE = "refused.json"
"""What a refused multirun job leaves in its directory (its overrides and the error), so the sweep goes on."""
SCHEMA_VERSION = 1


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


@dataclass(frozen=True)
class RunResults:
    """A run that trained to its end (or to its privacy budget) and was tested."""

    # what ran
    method: str
    privatizer: str
    optimizer: str
    model: str
    parameters: int
    trainable_parameters: int
    data: str
    private: bool
    device: str
    precision: str | None
    """trainer.precision: 32-true, 64-true or bf16-mixed (null in files written before it was recorded)."""
    seed: int
    run_dir: str
    config: dict[str, Any]
    method_details: dict[str, Any]
    # privacy
    epsilon: float | None
    epsilon_estimate: float | None
    accountant_method: str | None
    accountant_fallback_reason: str | None
    ledger_underreported: dict[str, Any] | None
    noise_multiplier_source: str | None
    target_epsilon: float | None
    planned_epsilon: float | None
    calibration_floor_hit: bool
    delta: float | None
    noise_multiplier: float | None
    clip_norm: float | None
    sampling: str
    sampling_rate: float
    secure_rng: bool
    privacy_seed: str
    outside_guarantee: list[str]
    per_sample_check: dict[str, Any] | None
    epsilon_caveat: str | None
    accounting_note: str | None
    # schedule
    batch_size: int
    train_size: int
    test_size: int
    validation_size: int
    steps: int
    epochs: int
    planned_steps: int
    stopped_on_budget: bool
    resumed_from_step: int | None
    extended_run: dict[str, Any] | None
    # quality: written as test_<metric> and validation_<metric>
    test_metric: str
    test_score: float
    test_loss: float
    validation_score: float | None
    validation_capped_loss: float | None
    """The validation split's mean loss with each example's capped at score_bound: what a total budget releases
    (with noise) for a loss task. Null without a bound or a validation split."""
    score_bound: float | None
    """The task's cap B on each example's loss (Task.score_bound), null where it has none (accuracy needs none)."""
    # cost
    samples_per_s: float | None
    step_time_s: float | None
    peak_memory_mb: float | None
    rank_peak_memory_mb: list[float] | None
    rank_memory_at_start_mb: list[float] | None
    resident_peak_mb: float | None
    max_memory_reserved_mb: float | None
    max_memory_allocated_mb: float | None
    memory_method: str | None
    page_faults_per_step: float | None
    host_memory: str | None
    train_time_s: float | None
    epsilon_log_time_s: float | None
    checkpoint_time_s: float | None
    profile_note: str | None
    # the privatizer's own figures (PrivatizerStrategy.privacy_report), written beside the fields above
    strategy_figures: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    RENAMED: ClassVar[tuple[str, ...]] = ("test_score", "validation_score", "strategy_figures")

    def __post_init__(self) -> None:
        clash = set(self.strategy_figures) & set(self.json_keys(self.test_metric))
        if clash:
            raise ConfigurationError(f"the privatizer's privacy_report() names results.json fields of dpbench's own: "
                                     f"{', '.join(sorted(clash))}; rename them")

    @classmethod
    def json_keys(cls, metric: str) -> list[str]:
        """The keys a version-1 file has besides the privatizer's own figures."""
        keys = [f.name for f in dataclasses.fields(cls) if f.name not in cls.RENAMED]
        return [*keys, f"test_{metric}", f"validation_{metric}"]

    @property
    def objective(self) -> float | None:
        """What sweepers optimize: the validation metric when a validation split exists, else the test metric."""
        return self.validation_score if self.validation_score is not None else self.test_score

    def to_json(self) -> dict[str, Any]:
        payload = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in self.RENAMED}
        payload[f"test_{self.test_metric}"] = self.test_score
        payload[f"validation_{self.test_metric}"] = self.validation_score
        return {**payload, **self.strategy_figures}

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> RunResults:
        metric = payload.get("test_metric", "accuracy")
        named = {f.name for f in dataclasses.fields(cls)} - set(cls.RENAMED)
        own = set(cls.json_keys(metric))
        values = {name: payload.get(name) for name in named} | {"schema_version": payload.get("schema_version", 0),
                                                                  "test_metric": metric}
        return cls(**values, test_score=payload.get(f"test_{metric}"),
                   validation_score=payload.get(f"validation_{metric}"),
                   strategy_figures={key: value for key, value in payload.items() if key not in own})


@dataclass(frozen=True)
class StoppedRun:
    """A run a failed per-sample check stopped: its steps were clipped wrongly, so it claims no epsilon."""

    privatizer: str
    stopped: str
    error: str
    epsilon_caveat: str
    steps: int
    per_sample_check: dict[str, Any] | None
    config: dict[str, Any]
    epsilon: None = None
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> StoppedRun:
        values = {f.name: payload.get(f.name) for f in dataclasses.fields(cls)}
        return cls(**values | {"schema_version": payload.get("schema_version", 0)})


def write_results(run_dir: Path, record: RunResults | StoppedRun) -> None:
    write_json_atomic(Path(run_dir) / RESULTS_FILE, record.to_json())


def read_results(path: Path) -> RunResults | StoppedRun:
    """The record in a run directory (or a results.json path). Refuses a file of a newer schema than this dpbench
    reads, naming it."""
    path = Path(path)
    file = path if path.name == RESULTS_FILE else path / RESULTS_FILE
    payload = json.loads(file.read_text())
    if not isinstance(payload, dict):
        raise ConfigurationError(f"{file} is not a results.json record (a JSON object)")
    version = payload.get("schema_version", 0)
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise ConfigurationError(f"{file} has results.json schema_version {version!r}; this dpbench reads up to "
                                 f"{SCHEMA_VERSION}: upgrade dpbench to read it")
    return StoppedRun.from_json(payload) if "stopped" in payload else RunResults.from_json(payload)


def _fmt(value: Any, spec: str = ".4g") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def _underreport(results: RunResults) -> str:
    """Where the reported epsilon is the privatizer's declared figure because its ledger composed less."""
    mark = results.ledger_underreported
    if not mark:
        return ""
    return f" from the privatizer's composition(): its ledger under-reported {_fmt(mark['ledger_epsilon'])}"


def _unmeasured(results: RunResults) -> str:
    """Why a run has no samples/s: its steps all fell in the profiler's warm-up."""
    warmup = ((results.config or {}).get("profiler") or {}).get("warmup_steps")
    if warmup is not None and results.steps <= warmup:
        return (f"- (not measured: the profile leaves out the first profiler.warmup_steps={warmup} steps, and the run "
                f"took {results.steps})")
    return "-"


def summary_text(results: RunResults) -> str:
    r = results
    rows = [
        ("run", f"{with_privatizer(r.method, r.privatizer)} | {r.model} | {r.data} | {r.device}"),
        (f"test {r.test_metric}", _fmt(r.test_score, ".4f")),
        ("epsilon (spent)", f"{_fmt(r.epsilon)} at delta={_fmt(r.delta)} [{r.accountant_method or '-'}]"
                            f"{_underreport(r)}"),
        ("noise multiplier", _fmt(r.noise_multiplier)),
        ("clip norm", _fmt(r.clip_norm)),
        ("sampling", f"{r.sampling} q={_fmt(r.sampling_rate)} batch={r.batch_size} N={r.train_size}"),
        ("steps / epochs", f"{r.steps} / {r.epochs}"),
        ("samples/s", _fmt(r.samples_per_s, ".1f") if r.samples_per_s is not None else _unmeasured(r)),
        ("peak memory", f"{_fmt(r.peak_memory_mb, '.1f')} MB ({r.memory_method or ''})"),
        ("train time", f"{_fmt(r.train_time_s, '.1f')} s"),
        ("results", r.run_dir),
    ]
    width = max(len(key) for key, _ in rows)
    line = "-" * 72
    return "\n".join([line, "dpbench run summary", line, *(f"{k:<{width}}  {v}" for k, v in rows), line])
