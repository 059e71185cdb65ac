"""Adam with its moments in GRAPE's projected space (the paper's Algorithm 2).

A projected weight's privatized gradient R lives in the projected space (r x n or m x r); its first and second
moments are kept there (the memory saving), and the Adam direction is mapped back to the weight with the same
projection matrix. Other parameters get plain Adam. Moments carry over when the projection is refreshed, as in
GaLore. Weight decay, when set, is decoupled (AdamW) and applied in the weight's own space.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

from dpbench.privatizers.projections import Projector
from dpbench.privatizers.sharding import is_sharded, shard_rows


class ProjectedAdam(torch.optim.Optimizer):
    """Reads projected gradients from `projected_grads` (filled by the strategy, consumed by step) and .grad."""

    def __init__(
        self, params: Iterable[nn.Parameter], projections: Projector,
        projected_grads: dict[nn.Parameter, Tensor], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8, weight_decay: float = 0.0,
    ):
        super().__init__(list(params), {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self.projections = projections
        self.projected_grads = projected_grads
        for group in self.param_groups:
            for param in group["params"]:
                self._init_state(param)

    def _init_state(self, param: nn.Parameter) -> None:
        """Moments made at once rather than at the first step: a sharded checkpoint (torch.distributed.checkpoint)
        restores into the state the optimizer has, and would find none for a projected weight before its first
        step (its zero-gradient warm-up step sees no projected gradient)."""
        spec = self.projections.specs.get(param)
        zeros = (torch.zeros(spec.projected_shape, dtype=param.dtype, device=param.device) if spec is not None
                 else torch.zeros_like(param))
        self.state[param] = {"step": 0, "exp_avg": zeros, "exp_avg_sq": zeros.clone()}

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:  # Lightning passes one (its hooks run there), as for any torch optimizer
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                projected = param in self.projections.specs
                grad = self.projected_grads.pop(param, None) if projected else param.grad
                if grad is None:
                    continue
                state = self.state[param]
                state["step"] += 1
                exp_avg, exp_avg_sq, step = state["exp_avg"], state["exp_avg_sq"], state["step"]
                exp_avg.lerp_(grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                denominator = (exp_avg_sq / (1 - beta2**step)).sqrt_().add_(group["eps"])
                direction = exp_avg / (1 - beta1**step) / denominator
                if group["weight_decay"]:
                    param.mul_(1 - group["lr"] * group["weight_decay"])
                if projected and is_sharded(param):  # this rank's rows of the mapped-back direction only
                    start, stop = shard_rows(param)
                    param.to_local().add_(self.projections.back(param, direction, start, stop), alpha=-group["lr"])
                    continue
                if projected:
                    direction = self.projections.back(param, direction)
                param.add_(direction, alpha=-group["lr"])
        return loss
