"""The memory/throughput frontier of several privatizers on one model: for each, the largest batch that trains under
a memory cap, its peak memory and samples/s, and the peak and samples/s at one fixed batch (the papers' tables).

Built on the max-batch search (max_batch.py): every trial is a fresh, capped process, so an out-of-memory trial is
recorded rather than taking the machine down, and a method whose model does not fit at all is "out of memory at
batch 1" (the GRAPE paper's OOM).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from functools import partial

from dpbench.app.max_batch import MEMORY_FIELDS, MaxBatchResult, Trial, find_max_batch
from dpbench.app.sharded_trial import run_sharded_trial, sharded_spec

FRONTIER_FIELDS = {
    **MEMORY_FIELDS,
    "peak_mb": "the method's peak at that batch: its trial's working_set_mb on CPU (the process's bytes in use at "
               "their peak, interpreter included), else process_peak_mb (VmHWM; CUDA: max_memory_reserved)",
    "samples_per_s": "batch size over the median time of the trial's steps after the first (a warm-up)",
}


@dataclass
class FrontierRow:
    """One privatizer's frontier; `trials` holds every batch tried (the plot's points)."""

    privatizer: str
    device: str
    max_batch_size: int
    peak_at_max_mb: float | None
    samples_per_s_at_max: float | None
    fixed_batch: int
    peak_at_fixed_mb: float | None
    samples_per_s_at_fixed: float | None
    interpreter_rss_mb: float | None
    out_of_memory_at_1: bool
    note: str = ""
    refused: bool = False
    """The method refused the model or setting (the note says why): nothing was measured."""
    trials: list[Trial] = field(default_factory=list)
    devices: int = 1
    """Ranks the method was sharded over (FSDP2; `name@N` in --privatizers), each on its own device: its peaks are
    the largest rank's."""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, row: dict) -> FrontierRow:
        """A row of a frontier.json, as `to_dict` wrote it; fields a record from another version has and this one
        does not are left out, ones it lacks take their defaults."""
        trial_fields = {f.name for f in fields(Trial)}
        trials = [Trial(**{k: v for k, v in trial.items() if k in trial_fields}) for trial in row.get("trials", [])]
        own = {f.name for f in fields(cls)} - {"trials"}
        return cls(**{k: v for k, v in row.items() if k in own}, trials=trials)


def _fitting(trials: list[Trial], batch_size: int) -> Trial | None:
    return next((t for t in reversed(trials) if t.batch_size == batch_size and t.fits), None)


def frontier_row(
    privatizer: str, overrides: list[str], cap_mb: float, fixed_batch: int, limit: int, resolution: float, steps: int,
    on_trial: Callable[[MaxBatchResult], None] | None = None,
) -> FrontierRow:
    """The search starts at the fixed batch, so its trial is also the fixed-batch measurement. `privatizer` may name
    ranks to shard over: `vanilla@4` (its trials are sharded runs: sharded_trial.py)."""
    name, devices = sharded_spec(privatizer)
    sharded = partial(_sharded, devices=devices) if devices > 1 else None
    result = find_max_batch([*overrides, f"privatizer={name}"], cap_mb, start=fixed_batch, limit=limit,
                            resolution=resolution, steps=steps, model_may_not_fit=True, on_trial=on_trial, run=sharded)
    at_max = _fitting(result.trials, result.max_batch_size)
    at_fixed = _fitting(result.trials, fixed_batch)
    interpreter = next((t.interpreter_rss_mb for t in result.trials if t.interpreter_rss_mb is not None), None)
    note = result.note
    if at_fixed is None and result.max_batch_size > 0:
        note = f"batch {fixed_batch} does not fit under {cap_mb:g} MB"
    return FrontierRow(
        name, result.device, result.max_batch_size,
        at_max.peak_mb if at_max else None, at_max.samples_per_s if at_max else None,
        fixed_batch, at_fixed.peak_mb if at_fixed else None, at_fixed.samples_per_s if at_fixed else None,
        interpreter, result.max_batch_size == 0, note, trials=result.trials, devices=devices,
    )


def _sharded(overrides: list[str], batch_size: int, cap_mb: float, steps: int, device: str, devices: int) -> Trial:
    return run_sharded_trial(overrides, batch_size, cap_mb, steps, devices)


def refused_row(privatizer: str, device: str, fixed_batch: int, reason: str) -> FrontierRow:
    name, devices = sharded_spec(privatizer)
    return FrontierRow(name, device, 0, None, None, fixed_batch, None, None, None, False, note=reason, refused=True,
                       devices=devices)
