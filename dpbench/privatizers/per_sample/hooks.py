"""Per-sample gradient engine on module hooks: one forward, one backward to the layer outputs only.

The backward asks autograd for the gradients of the recorded layer *outputs*, so it never computes the
(unused) batch weight gradients; per-sample norms and the clipped sum are then formed from the recorded
activations (ghost norms where cheaper). Covers Linear, Conv1d/2d, Embedding, LayerNorm and GroupNorm.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import Tensor, nn

from dpbench.errors import UnsupportedModelError
from dpbench.privatizers.clipping import clip_factors
from dpbench.privatizers.per_sample.base import ClippedSum, refuse_sample_mixing_layers, trainable_parameters
from dpbench.privatizers.per_sample.layers import handler_for
from dpbench.privatizers.per_sample.sites import Site
from dpbench.tasks import Batch, Task


def unsupported_modules(model: nn.Module) -> list[str]:
    """Modules holding trainable parameters that the hook engine has no rule for."""
    names = []
    for name, module in model.named_modules():
        owns_trainable = any(p.requires_grad for p in module.parameters(recurse=False))
        if owns_trainable and handler_for(module) is None:
            names.append(f"{name or '<root>'} ({type(module).__name__})")
    return names


class HookEngine:
    """Records (module, input, output) during the forward pass; reads output gradients after it."""

    def __init__(self, model: nn.Module):
        refuse_sample_mixing_layers(model)
        unsupported = unsupported_modules(model)
        if unsupported:
            raise UnsupportedModelError(
                "the hook engine has no per-sample rule for: " + ", ".join(unsupported)
                + "; use privatizer.engine=functorch (vmap) for this model"
            )
        self.model = model
        self.names = {p: name for name, p in trainable_parameters(model).items()}
        self._records: list[tuple[nn.Module, Tensor, Tensor]] = []
        self._recording = False
        self._handles = [
            module.register_forward_hook(self._record)
            for module in model.modules()
            if handler_for(module) is not None and any(p.requires_grad for p in module.parameters(recurse=False))
        ]

    def _record(self, module: nn.Module, args: tuple, output: Tensor) -> None:
        if self._recording and torch.is_grad_enabled():
            self._records.append((module, args[0], output))

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()

    def _forward(self, task: Task, batch: Batch) -> Tensor:
        self._records = []
        self._recording = True
        try:
            return task.per_sample_loss(self.model, batch)
        finally:
            self._recording = False

    def _sites(self, task: Task, batch: Batch, dense: bool) -> tuple[dict[str, list[Site]], Tensor]:
        losses = self._forward(task, batch)
        records, self._records = self._records, []
        outputs = [output for _, _, output in records]
        output_grads = torch.autograd.grad(losses.sum(), outputs, allow_unused=True, materialize_grads=True)
        calls_per_param: dict[nn.Parameter, int] = defaultdict(int)
        for module, _, _ in records:
            for p in module.parameters(recurse=False):
                calls_per_param[p] += 1
        sites: dict[str, list[Site]] = defaultdict(list)
        for (module, x, _), g in zip(records, output_grads, strict=True):
            shared = any(calls_per_param[p] > 1 for p in module.parameters(recurse=False))
            for param, site in handler_for(module)(module, x.detach(), g, dense or shared).items():
                sites[self.names[param]].append(site)
        return sites, losses.detach()

    def per_sample_gradients(self, task: Task, batch: Batch) -> dict[str, Tensor]:
        """Materialized (B, *shape) gradients: for tests and for strategies that transform them."""
        sites, _ = self._sites(task, batch, dense=True)
        return {name: sum(site.materialize() for site in group) for name, group in sites.items()}

    def clipped_sum(self, task: Task, batch: Batch, clip_norm: float) -> ClippedSum:
        sites, losses = self._sites(task, batch, dense=False)
        norm_sq = torch.zeros(losses.shape[0], device=losses.device)
        for group in sites.values():
            if len(group) == 1:
                norm_sq += group[0].norm_sq()
            else:  # a parameter used at several sites was materialized at each: add the gradients first
                norm_sq += sum(site.materialize() for site in group).flatten(1).pow(2).sum(1)
        norms = norm_sq.sqrt()
        factors = clip_factors(norms, clip_norm)
        bad = ~torch.isfinite(norms)
        if bad.any():
            for group in sites.values():
                for site in group:
                    site.zero_samples(bad)
        grads = {name: sum(site.weighted_sum(factors) for site in group) for name, group in sites.items()}
        for name, param in trainable_parameters(self.model).items():
            if name not in grads:  # not reached by this batch's forward pass: its gradient is zero
                grads[name] = torch.zeros_like(param)
        return ClippedSum(grads=grads, norms=norms, losses=losses)
