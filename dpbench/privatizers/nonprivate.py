"""Non-private baseline: the mean loss of the batch, backward, no clipping, no noise."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dpbench.core.tasks import Batch, Task, batch_size_of
from dpbench.privacy.mechanisms import Composition, Mechanism
from dpbench.privatizers import distributed
from dpbench.privatizers.base import PrivatizerStrategy, StepContext
from dpbench.privatizers.per_sample.precision import model_forward


@dataclass
class NonPrivateConfig:
    name: str = "nonprivate"


class NonPrivate(PrivatizerStrategy):
    name = "nonprivate"
    supports_mixed_precision = True
    config: NonPrivateConfig
    is_private = False

    def attach(self, model: nn.Module) -> None:
        self._samples = 0

    def step_mechanisms(self, step: int) -> list[Mechanism]:
        return []

    def composition(self, noise_multiplier: float, steps: int) -> Composition:
        return []

    def accumulate(self, model: nn.Module, task: Task, batch: Batch, ctx: StepContext) -> tuple[float, dict]:
        size = batch_size_of(batch)
        if size == 0:
            return 0.0, {"batch_size": 0.0}
        with model_forward():
            loss = task.per_sample_loss(model, batch).sum()
        loss.backward()
        self._samples += size
        return float(loss.detach()), {"batch_size": float(size)}

    def finalize(self, model: nn.Module, ctx: StepContext) -> None:
        """Mean over the samples actually seen on all ranks (accumulated .grad holds this rank's sum)."""
        samples = float(distributed.all_reduce_sum(torch.tensor(float(self._samples))))
        for param in model.parameters():
            if param.requires_grad:
                if param.grad is None:
                    param.grad = torch.zeros_like(param)
                distributed.all_reduce_sum(param.grad)
                if samples:
                    param.grad.div_(samples)
        self._samples = 0
