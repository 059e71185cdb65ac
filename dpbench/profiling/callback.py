"""Samples/s over the steps after warm-up, the phase's peak memory, and on CPU the working set (working_set.py),
read on the warm-up steps. A private run counts each step's expected
batch size (public), not the realised Poisson one: the sum of realised sizes would publish membership without noise.

The window is the training steps: bookkeeping a run does between them (the epoch end's accounting, whose scratch
once made sparse's reported memory the accountant's rather than its own) runs inside `unmeasured`, which leaves it
out of the peak memory; the throughput counts only the steps' own time anyway.
"""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import lightning as L
import torch

from dpbench.profiling.memory import PeakMemory
from dpbench.profiling.working_set import PeakInUse, in_use_bytes


class WindowPeakMemory(PeakMemory):
    """PeakMemory with pauses: what runs between pause() and resume() is left out. Each measured stretch is a
    PeakMemory phase; the figure is the highest level any stretch reached (CPU: resident size, CUDA: reserved
    memory) above the window's baseline at start(). On CPU without a resettable high-water mark (ru_maxrss, the
    process's lifetime peak) a pause leaves nothing out."""

    def __init__(self, device: torch.device):
        super().__init__(device)
        self.paused = False
        self._window_baseline_mb = 0.0
        self._highest_mb = 0.0
        self.max_memory_allocated_mb: float | None = None
        """CUDA: the highest max_memory_allocated of any stretch (the tensors' bytes, beside the reserved pool)."""

    def start(self) -> None:
        super().start()
        self._window_baseline_mb = self.baseline_mb
        self._highest_mb, self.paused = 0.0, False

    def pause(self) -> None:
        if not self.paused:
            self._end_stretch()
            self.paused = True

    def resume(self) -> None:
        if self.paused:
            super().start()  # resets the high-water mark (CUDA: the peak statistics)
            self.paused = False

    def stop(self) -> None:
        if not self.paused:
            self._end_stretch()
        self.baseline_mb = self._window_baseline_mb
        if self.device.type == "cuda":
            self.peak_mb = self.max_memory_reserved_mb = self._highest_mb
        else:
            self.peak_mb = max(0.0, self._highest_mb - self._window_baseline_mb)

    def _end_stretch(self) -> None:
        super().stop()
        if self.device.type == "cuda":
            allocated = torch.cuda.max_memory_allocated(self.device) / 2**20
            self.max_memory_allocated_mb = max(self.max_memory_allocated_mb or 0.0, allocated)
        peak = self.peak_mb or 0.0
        level = peak if self.device.type == "cuda" else self.baseline_mb + peak
        self._highest_mb = max(self._highest_mb, level)


class ProfilerCallback(L.Callback):
    def __init__(self, warmup_steps: int = 5, expected_batch_size: float | None = None,
                 reference_batch_size: float | None = None):
        """`expected_batch_size`: counted for every step of a private run instead of the realised batch;
        `reference_batch_size`: the batch the working set is given at (default: the expected one)."""
        self.warmup_steps = warmup_steps
        self.expected_batch_size = expected_batch_size
        self.reference_batch_size = reference_batch_size if reference_batch_size is not None else expected_batch_size
        self.memory: WindowPeakMemory | None = None
        self.measured_time = 0.0
        self.measured_samples = 0.0
        self.measured_steps = 0
        self.total_train_time = 0.0
        self._steps_seen = 0
        self._step_started = 0.0
        self.faults_each_step: list[int] = []
        self.step_working_sets: list[tuple[int, float]] = []
        """CPU: (realised batch size, peak of malloc's bytes in use above training's start) of each warm-up step."""
        self._in_use_at_start: int | None = None
        self._reading: PeakInUse | None = None
        self.rank_peaks_mb: list[float] | None = None
        """Each rank's peak in a process group (None for one process)."""
        self.rank_starts_mb: list[float] | None = None
        """CPU: each rank's malloc bytes in use at training's start, which its peak is above (zeros on CUDA, whose
        peaks are the reserved pool's whole size): with rank_peaks_mb, each rank's whole working set."""
        self._faults_at_start = 0

    def _sync(self, pl_module: L.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.memory = WindowPeakMemory(pl_module.device)
        self.memory.start()
        self._in_use_at_start = in_use_bytes() if pl_module.device.type == "cpu" else None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int):
        self._sync(pl_module)
        if self._in_use_at_start is not None and self._steps_seen < self.warmup_steps:
            self._reading = PeakInUse()
            self._reading.__enter__()
        self._faults_at_start = _minor_faults()
        self._step_started = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch: Any, batch_idx: int) -> None:
        self._sync(pl_module)
        elapsed = time.perf_counter() - self._step_started
        self._end_reading(int(batch[1].shape[0]))
        faults = _minor_faults() - self._faults_at_start
        self.total_train_time += elapsed
        self._steps_seen += 1
        if self._steps_seen > self.warmup_steps:
            self.measured_time += elapsed
            self.measured_samples += (int(batch[1].shape[0]) if self.expected_batch_size is None
                                      else self.expected_batch_size)
            self.measured_steps += 1
            self.faults_each_step.append(faults)

    def _end_reading(self, batch_size: int | None = None) -> None:
        if self._reading is None or self._in_use_at_start is None:
            return
        self._reading.__exit__(None, None, None)
        if batch_size is not None:
            self.step_working_sets.append((batch_size, max(0.0, (self._reading.peak - self._in_use_at_start) / 2**20)))
        self._reading = None

    @property
    def working_set_mb(self) -> float | None:
        """The working set of a step of the expected batch size: the warm-up steps' peaks fitted against their
        (Poisson) batch sizes, so that a run whose warm-up drew large batches reads as one that drew small ones;
        their largest peak where the batch is not Poisson-sampled."""
        if not self.step_working_sets:
            return None
        sizes = [size for size, _ in self.step_working_sets]
        peaks = [peak for _, peak in self.step_working_sets]
        if self.reference_batch_size is None or len(set(sizes)) < 2:
            return max(peaks)
        slope, intercept = statistics.linear_regression(sizes, peaks)
        return max(0.0, intercept + slope * self.reference_batch_size)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._end_reading()  # a failed step must not leave the dispatch mode on

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.memory is not None:
            self.memory.stop()
            if trainer.world_size > 1:  # every rank's peak: the group's is their sum
                start = (self._in_use_at_start or 0) / 2**20 if pl_module.device.type == "cpu" else 0.0
                mine = torch.tensor([self.peak_mb or 0.0, start], dtype=torch.float64, device=pl_module.device)
                gathered = trainer.strategy.all_gather(mine).reshape(-1, 2).cpu()
                self.rank_peaks_mb = [float(peak) for peak in gathered[:, 0]]
                self.rank_starts_mb = [float(start) for start in gathered[:, 1]]
        for logger in trainer.loggers:
            logger.log_metrics(self.summary(), step=trainer.global_step)

    @property
    def peak_mb(self) -> float | None:
        """The run's peak: on CPU its working set where it was read, else (CUDA, or no warm-up step on CPU) the
        window's peak (max_memory_reserved; VmHWM)."""
        if self.working_set_mb is not None:
            return self.working_set_mb
        return self.memory.peak_mb if self.memory is not None else None

    @property
    def memory_method(self) -> str | None:
        if self.working_set_mb is not None:
            return "working set: malloc's bytes in use at their peak over the warm-up steps, above training's start"
        return self.memory.method if self.memory is not None else None

    @property
    def samples_per_s(self) -> float | None:
        return self.measured_samples / self.measured_time if self.measured_time > 0 else None

    @property
    def page_faults_per_step(self) -> float | None:
        """Host memory a measured step faults in (training/host_memory.py): the mean over the steps after leaving out
        the tenth (at least one step) that faulted most. The allocator giving back what steps free faults at every
        step, or at many, and shows; a one-off does not (CI once had one step of 850 faults in 15, read as 56.7 a
        step)."""
        faults = sorted(self.faults_each_step)
        if len(faults) > 1:
            faults = faults[: len(faults) - max(1, len(faults) // 10)]
        return statistics.fmean(faults) if faults else None

    def summary(self) -> dict[str, float]:
        summary: dict[str, float] = {"profile/measured_steps": float(self.measured_steps)}
        if self.samples_per_s is not None:
            summary["profile/samples_per_s"] = self.samples_per_s
            summary["profile/step_time_s"] = self.measured_time / self.measured_steps
            summary["profile/page_faults_per_step"] = self.page_faults_per_step
        if self.peak_mb is not None:
            summary["profile/peak_memory_mb"] = self.peak_mb
        return summary


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


@contextmanager
def unmeasured(trainer: L.Trainer) -> Iterator[None]:
    """Run the enclosed work outside every ProfilerCallback's memory window (it is outside the step times already):
    what a run computes about its steps, such as their epsilon, is not the method's cost."""
    windows = [callback.memory for callback in trainer.callbacks
               if isinstance(callback, ProfilerCallback) and callback.memory is not None]
    for memory in windows:
        memory.pause()
    try:
        yield
    finally:
        for memory in windows:
            memory.resume()
