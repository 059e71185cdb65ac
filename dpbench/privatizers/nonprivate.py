"""Non-private baseline: the mean loss of the batch, backward, no clipping, no noise."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from dpbench.privacy.mechanisms import Composition, Mechanism
from dpbench.privatizers.base import PrivatizerStrategy, StepContext
from dpbench.tasks import Batch, Task, batch_size_of


@dataclass
class NonPrivateConfig:
    name: str = "nonprivate"


class NonPrivate(PrivatizerStrategy):
    name = "nonprivate"
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
        loss = task.per_sample_loss(model, batch).sum()
        loss.backward()
        self._samples += size
        return float(loss.detach()), {"batch_size": float(size)}

    def finalize(self, model: nn.Module, ctx: StepContext) -> None:
        """Mean over the samples actually seen (accumulated .grad holds the sum)."""
        for param in model.parameters():
            if param.grad is not None and self._samples:
                param.grad.div_(self._samples)
        self._samples = 0
