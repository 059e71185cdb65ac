"""DP-GRAPE (Mulrooney et al. 2025): clip and noise per-sample gradients in a random low-dimensional projection.

Matrix weights (nn.Linear, HF Conv1D) get their per-sample gradients projected while they are formed (see
projections.py); every other parameter gets its exact per-sample gradient. The concatenation is clipped to C,
summed, and noised with sigma*C in that projected space, so the accountant's plain Poisson-subsampled Gaussian is
the mechanism (the projection is data-independent). Projected Adam then keeps its moments in the projected space.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from dpbench.core.errors import ConfigurationError
from dpbench.core.tasks import Batch, Task
from dpbench.privatizers.base import PrivatizerStrategy, StepContext
from dpbench.privatizers.clipping import clipping_stats
from dpbench.privatizers.per_sample import check_hook_engine, trainable_parameters
from dpbench.privatizers.projected_adam import ProjectedAdam
from dpbench.privatizers.projections import (
    ProjectedHookEngine,
    RandomProjections,
    projected_adam_state_bytes,
    projection_details,
    refuse_nothing_projected,
)
from dpbench.privatizers.sharding import is_sharded


@dataclass
class GrapeConfig:
    name: str = "grape"
    rank: int = 32
    """r: projection dimension. Weights with min(m, n) <= r are not projected (exact per-sample gradients)."""
    update_every: int = 100
    """F: steps between projection refreshes."""


def check_adam(optimizer_config: Any, privatizer: str) -> None:
    """Projected Adam is the only optimizer of the projecting strategies."""
    if optimizer_config.name not in ("adam", "adamw"):
        raise ConfigurationError(
            f"privatizer={privatizer} trains with projected Adam: use optimizer=adam, not {optimizer_config.name!r}"
        )
    if optimizer_config.name == "adam" and optimizer_config.weight_decay:
        raise ConfigurationError(f"privatizer={privatizer} applies decoupled weight decay only: use optimizer=adamw")
    if optimizer_config.lr <= 0:
        raise ConfigurationError(f"optimizer.lr must be positive, got {optimizer_config.lr}")


class Grape(PrivatizerStrategy):
    name = "grape"
    supports_mixed_precision = True
    supports_sharding = True
    per_sample_activation_share = 0.2  # records, projected per-sample gradients (ViT 4.8M: BENCHMARKS.md)
    config: GrapeConfig

    def preflight(self, model: nn.Module, optimizer_config: Any | None) -> None:
        super().preflight(model, optimizer_config)
        if optimizer_config is not None:
            check_adam(optimizer_config, self.name)
        check_hook_engine(model)
        refuse_nothing_projected(model, self.config.rank, self.name)

    def optimizer_state_bytes(self, model: nn.Module, optimizer_config: Any) -> int:
        return projected_adam_state_bytes(model, self.config.rank)

    def method_details(self, model: nn.Module) -> dict[str, Any]:
        return projection_details(model, self.config.rank, self.config.update_every)

    def attach(self, model: nn.Module) -> None:
        self.projections = RandomProjections(model, self.config.rank, self.config.update_every, self.privacy.randomness)
        self.engine = ProjectedHookEngine(model, self.projections, self.checks)
        self.spaces = {
            name: torch.Size(self.projections.specs[param].projected_shape) if param in self.projections.specs
            else param.shape
            for name, param in trainable_parameters(model).items()
        }
        self._sums: dict[str, Tensor] = {}
        self._projected_grads: dict[nn.Parameter, Tensor] = {}

    def configure_optimizer(self, model: nn.Module, optimizer_config: Any) -> Optimizer:
        check_adam(optimizer_config, self.name)
        return ProjectedAdam(
            trainable_parameters(model).values(), self.projections, self._projected_grads, lr=optimizer_config.lr,
            betas=tuple(optimizer_config.betas), eps=optimizer_config.eps, weight_decay=optimizer_config.weight_decay,
        )

    def accumulate(self, model: nn.Module, task: Task, batch: Batch, ctx: StepContext) -> tuple[float, dict]:
        self.projections.step = ctx.step
        if self.skips(model, batch):
            return 0.0, {"batch_size": 0.0}
        result = self.engine.clipped_sum(task, batch, self.privacy.clip_norm)
        for name, grad in result.grads.items():
            if grad.shape != self.spaces[name]:  # a projected weight this batch never reached: its zero fill
                continue
            self._sums[name] = self._sums[name] + grad if name in self._sums else grad
        return float(result.losses.sum()), clipping_stats(result.norms, self.privacy.clip_norm)

    def finalize(self, model: nn.Module, ctx: StepContext) -> None:
        """Noise in the projected space, once across ranks; projected gradients go to the optimizer, others to .grad
        (under FSDP2 each rank's rows, noised by that rank: privatizers.sharding)."""
        self.projections.step = ctx.step
        std = self.noise_multiplier * self.privacy.clip_norm
        for name, param in trainable_parameters(model).items():
            total = self._sums.get(name)
            if is_sharded(param) and param not in self.projections.specs:
                param.grad = self.noised_shard_mean(param, total, std, ctx)
                continue
            if total is None:
                total = torch.zeros(self.spaces[name], dtype=param.dtype, device=param.device)
            noisy = self.noised_sum(total, std).div_(ctx.expected_batch_size)  # replicated: noised once, by rank 0
            if param in self.projections.specs:
                self._projected_grads[param] = noisy
            else:
                param.grad = noisy
        self._sums = {}
