"""Vanilla DP-SGD / DP-Adam: exact per-sample gradients clipped to C, summed, Gaussian noise sigma*C."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from dpbench.core.tasks import Batch, Task
from dpbench.privatizers.base import PrivatizerStrategy, StepContext
from dpbench.privatizers.clipping import clipping_stats
from dpbench.privatizers.per_sample import PerSampleEngine, check_engine, engine_state_bytes, make_engine


@dataclass
class VanillaConfig:
    name: str = "vanilla"
    engine: str = "auto"
    """auto | hooks | functorch | materialized: see dpbench.privatizers.per_sample.make_engine."""
    chunk_size: int | None = None
    """functorch engine only: samples per vmap chunk, to bound memory."""


class Vanilla(PrivatizerStrategy):
    name = "vanilla"
    supports_mixed_precision = True
    supports_sharding = True
    config: VanillaConfig

    engine: PerSampleEngine

    def preflight(self, model: nn.Module, optimizer_config: Any | None) -> None:
        super().preflight(model, optimizer_config)
        check_engine(model, self.config.engine)

    def per_sample_state_bytes(self, model: nn.Module, micro_batch: int, activation_bytes: int) -> int:
        return engine_state_bytes(model, self.config.engine, self.config.chunk_size, micro_batch, activation_bytes)

    def attach(self, model: nn.Module) -> None:
        self.engine = make_engine(model, self.config.engine, self.config.chunk_size, self.checks)
        self._sums: dict[str, Tensor] = {}

    def accumulate(self, model: nn.Module, task: Task, batch: Batch, ctx: StepContext) -> tuple[float, dict]:
        if self.skips(model, batch):  # an empty Poisson batch is still a step: noise only
            return 0.0, {"batch_size": 0.0}
        result = self.engine.clipped_sum(task, batch, self.privacy.clip_norm)
        for name, grad in result.grads.items():
            self._sums[name] = self._sums[name] + grad if name in self._sums else grad
        return float(result.losses.sum()), clipping_stats(result.norms, self.privacy.clip_norm)

    def finalize(self, model: nn.Module, ctx: StepContext) -> None:
        self.write_noisy_mean(model, self._sums, ctx)
        self._sums = {}
