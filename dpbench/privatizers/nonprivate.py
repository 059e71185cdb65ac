"""Non-private baseline: the mean loss of the batch, one backward pass, no clipping, no noise."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from dpbench.privacy.mechanisms import Composition, Mechanism
from dpbench.privatizers.base import PrivatizerStrategy, StepContext, StepOutput
from dpbench.tasks import Batch, Task, batch_size_of


@dataclass
class NonPrivateConfig:
    name: str = "nonprivate"


class NonPrivate(PrivatizerStrategy):
    name = "nonprivate"
    is_private = False

    def step_mechanisms(self, step: int) -> list[Mechanism]:
        return []

    def composition(self, noise_multiplier: float, steps: int) -> Composition:
        return []

    def privatize(self, model: nn.Module, task: Task, batch: Batch, ctx: StepContext) -> StepOutput:
        size = batch_size_of(batch)
        if size == 0:
            for param in model.parameters():
                param.grad = None
            return StepOutput(loss=float("nan"), stats={"batch_size": 0.0})
        loss = task.per_sample_loss(model, batch).mean()
        loss.backward()
        return StepOutput(loss=float(loss.detach()), stats={"batch_size": float(size)})
