"""Samples/s over the steps after warm-up, counting the samples actually processed, and the phase's peak memory."""

from __future__ import annotations

import time
from typing import Any

import lightning as L
import torch

from dpbench.profiling.memory import PeakMemory


class ProfilerCallback(L.Callback):
    def __init__(self, warmup_steps: int = 5):
        self.warmup_steps = warmup_steps
        self.memory: PeakMemory | None = None
        self.measured_time = 0.0
        self.measured_samples = 0
        self.measured_steps = 0
        self.total_train_time = 0.0
        self._steps_seen = 0
        self._step_started = 0.0

    def _sync(self, pl_module: L.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.memory = PeakMemory(pl_module.device)
        self.memory.start()

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int):
        self._sync(pl_module)
        self._step_started = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch: Any, batch_idx: int) -> None:
        self._sync(pl_module)
        elapsed = time.perf_counter() - self._step_started
        self.total_train_time += elapsed
        self._steps_seen += 1
        if self._steps_seen > self.warmup_steps:
            self.measured_time += elapsed
            self.measured_samples += int(batch[1].shape[0])
            self.measured_steps += 1

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.memory is not None:
            self.memory.stop()
        for logger in trainer.loggers:
            logger.log_metrics(self.summary(), step=trainer.global_step)

    @property
    def samples_per_s(self) -> float | None:
        return self.measured_samples / self.measured_time if self.measured_time > 0 else None

    def summary(self) -> dict[str, float]:
        summary: dict[str, float] = {"profile/measured_steps": float(self.measured_steps)}
        if self.samples_per_s is not None:
            summary["profile/samples_per_s"] = self.samples_per_s
            summary["profile/step_time_s"] = self.measured_time / self.measured_steps
        if self.memory is not None and self.memory.peak_mb is not None:
            summary["profile/peak_memory_mb"] = self.memory.peak_mb
        return summary
