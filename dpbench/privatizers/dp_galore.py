"""Naive DP-GaLore (Mulrooney et al. 2025, Algorithm 5): privatize full-dimensional gradients, then project by SVD.

Per-sample gradients are clipped and noised as in vanilla DP-Adam; every `update_every` steps each projected
weight's projector becomes the top-r singular vectors (on its smaller side) of its privatized gradient, a
post-processing of private outputs, so the mechanism is vanilla's Poisson-subsampled Gaussian. Adam then runs in
that subspace (ProjectedAdam, shared with GRAPE). Unlike GRAPE it keeps full per-sample work and SVDs per layer:
it is the paper's baseline, not a memory saver.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from dpbench.core.errors import ConfigurationError
from dpbench.privatizers.base import StepContext
from dpbench.privatizers.grape import check_adam
from dpbench.privatizers.per_sample import trainable_parameters
from dpbench.privatizers.projected_adam import ProjectedAdam
from dpbench.privatizers.projections import (
    ProjectionSpec,
    Projector,
    projectable_weights,
    projected_adam_state_bytes,
    projection_details,
    refuse_nothing_projected,
)
from dpbench.privatizers.vanilla import Vanilla


@dataclass
class DPGaLoreConfig:
    name: str = "dp_galore"
    rank: int = 32
    """r: subspace dimension. Weights with min(m, n) <= r get plain Adam."""
    update_every: int = 100
    """F: steps between SVDs of the privatized gradient."""
    engine: str = "auto"
    chunk_size: int | None = None


class SVDProjections(Projector):
    """Top-r singular vectors of a weight's privatized gradient, kept until the next refresh (GaLore stores them)."""

    def __init__(self, model: nn.Module, rank: int):
        weights = projectable_weights(model, rank)
        self.specs = {weight: ProjectionSpec(i, tuple(weight.shape), rank) for i, (_, weight) in enumerate(weights)}
        self.matrices: dict[nn.Parameter, Tensor] = {}

    def refresh(self, weight: nn.Parameter, grad: Tensor) -> None:
        left, _, right_t = torch.linalg.svd(grad, full_matrices=False)
        rank = self.specs[weight].rank
        self.matrices[weight] = (left[:, :rank] if self.specs[weight].left else right_t[:rank].T).contiguous()

    def matrix(self, weight: nn.Parameter) -> Tensor:
        return self.matrices[weight]


class DPGaLore(Vanilla):
    name = "dp_galore"
    supports_sharding = False  # its SVD reads the whole noisy gradient
    config: DPGaLoreConfig

    def preflight(self, model: nn.Module, optimizer_config: Any | None) -> None:
        super().preflight(model, optimizer_config)
        if optimizer_config is not None:
            check_adam(optimizer_config, self.name)
        refuse_nothing_projected(model, self.config.rank, self.name)

    def optimizer_state_bytes(self, model: nn.Module, optimizer_config: Any) -> int:
        return projected_adam_state_bytes(model, self.config.rank)

    def method_details(self, model: nn.Module) -> dict[str, Any]:
        return projection_details(model, self.config.rank, self.config.update_every)

    def attach(self, model: nn.Module) -> None:
        super().attach(model)
        if self.config.rank <= 0 or self.config.update_every <= 0:
            raise ConfigurationError("privatizer.rank and privatizer.update_every must be positive")
        self.projections = SVDProjections(model, self.config.rank)
        self._projected_grads: dict[nn.Parameter, Tensor] = {}
        self._order = list(self.projections.specs)

    def configure_optimizer(self, model: nn.Module, optimizer_config: Any) -> Optimizer:
        check_adam(optimizer_config, self.name)
        return ProjectedAdam(
            trainable_parameters(model).values(), self.projections, self._projected_grads, lr=optimizer_config.lr,
            betas=tuple(optimizer_config.betas), eps=optimizer_config.eps, weight_decay=optimizer_config.weight_decay,
        )

    def finalize(self, model: nn.Module, ctx: StepContext) -> None:
        """Vanilla's noisy full gradient, then (every F steps an SVD and) its projection for the optimizer."""
        super().finalize(model, ctx)
        for weight in self._order:
            if ctx.step % self.config.update_every == 0 or weight not in self.projections.matrices:
                self.projections.refresh(weight, weight.grad)
            self._projected_grads[weight] = self.projections.project(weight, weight.grad)
            weight.grad = None

    def state_dict(self) -> dict[str, Any]:
        matrices = [self.projections.matrices.get(weight) for weight in self._order]
        return {**super().state_dict(), "projectors": matrices}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        for weight, matrix in zip(self._order, state["projectors"], strict=True):
            if matrix is not None:
                self.projections.matrices[weight] = matrix.to(weight.device)
