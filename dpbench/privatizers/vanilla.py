"""Vanilla DP-SGD / DP-Adam: exact per-sample gradients clipped to C, summed, Gaussian noise sigma*C."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from dpbench.privatizers.base import PrivatizerStrategy, StepContext, StepOutput
from dpbench.privatizers.clipping import clipping_stats
from dpbench.privatizers.per_sample import PerSampleEngine, make_engine
from dpbench.tasks import Batch, Task, batch_size_of


@dataclass
class VanillaConfig:
    name: str = "vanilla"
    engine: str = "auto"
    """auto | hooks | functorch: see dpbench.privatizers.per_sample.make_engine."""
    chunk_size: int | None = None
    """functorch engine only: samples per vmap chunk, to bound memory."""


class Vanilla(PrivatizerStrategy):
    name = "vanilla"

    engine: PerSampleEngine

    def attach(self, model: nn.Module) -> None:
        self.engine = make_engine(model, self.config.engine, self.config.chunk_size)

    def privatize(self, model: nn.Module, task: Task, batch: Batch, ctx: StepContext) -> StepOutput:
        if batch_size_of(batch) == 0:  # an empty Poisson batch is still a step: noise only
            self.write_noisy_mean(model, {}, ctx)
            return StepOutput(loss=float("nan"), stats={"batch_size": 0.0})
        result = self.engine.clipped_sum(task, batch, self.privacy.clip_norm)
        self.write_noisy_mean(model, result.grads, ctx)
        stats = clipping_stats(result.norms, self.privacy.clip_norm)
        return StepOutput(loss=float(result.losses.mean()), stats=stats)
