"""Samples/s over the steps after warm-up, and the phase's peak memory. A private run counts each step's expected
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
        peak = self.peak_mb or 0.0
        level = peak if self.device.type == "cuda" else self.baseline_mb + peak
        self._highest_mb = max(self._highest_mb, level)


class ProfilerCallback(L.Callback):
    def __init__(self, warmup_steps: int = 5, expected_batch_size: float | None = None):
        """`expected_batch_size`: counted for every step of a private run instead of the realised batch."""
        self.warmup_steps = warmup_steps
        self.expected_batch_size = expected_batch_size
        self.memory: WindowPeakMemory | None = None
        self.measured_time = 0.0
        self.measured_samples = 0.0
        self.measured_steps = 0
        self.total_train_time = 0.0
        self._steps_seen = 0
        self._step_started = 0.0
        self.faults_each_step: list[int] = []
        self.rank_peaks_mb: list[float] | None = None
        """Each rank's peak in a process group (None for one process)."""
        self._faults_at_start = 0

    def _sync(self, pl_module: L.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.memory = WindowPeakMemory(pl_module.device)
        self.memory.start()

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int):
        self._sync(pl_module)
        self._faults_at_start = _minor_faults()
        self._step_started = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch: Any, batch_idx: int) -> None:
        self._sync(pl_module)
        elapsed = time.perf_counter() - self._step_started
        faults = _minor_faults() - self._faults_at_start
        self.total_train_time += elapsed
        self._steps_seen += 1
        if self._steps_seen > self.warmup_steps:
            self.measured_time += elapsed
            self.measured_samples += (int(batch[1].shape[0]) if self.expected_batch_size is None
                                      else self.expected_batch_size)
            self.measured_steps += 1
            self.faults_each_step.append(faults)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.memory is not None:
            self.memory.stop()
            if trainer.world_size > 1:  # every rank's peak: the group's is their sum
                mine = torch.tensor([self.memory.peak_mb or 0.0], dtype=torch.float64, device=pl_module.device)
                gathered = trainer.strategy.all_gather(mine)
                self.rank_peaks_mb = [float(peak) for peak in gathered.reshape(-1).cpu()]
        for logger in trainer.loggers:
            logger.log_metrics(self.summary(), step=trainer.global_step)

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
        if self.memory is not None and self.memory.peak_mb is not None:
            summary["profile/peak_memory_mb"] = self.memory.peak_mb
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
