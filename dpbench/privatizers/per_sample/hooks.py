"""Per-sample gradient engine on module hooks: one forward, one backward to the layer outputs only.

The backward asks autograd for the gradients of the recorded layer *outputs*, so it never computes the
(unused) batch weight gradients; per-sample norms and the clipped sum are then formed from the recorded
activations (ghost norms where cheaper). Covers Linear, Conv1d/2d, Embedding, LayerNorm, GroupNorm and the
Hugging Face layers named in layers.NAMED_HANDLERS (Conv1D, ViT embeddings, OPT positions).
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from dpbench.errors import UnsupportedModelError
from dpbench.privatizers.clipping import FactorFn, clip_factors
from dpbench.privatizers.per_sample.base import ClippedSum, refuse_sample_mixing_layers, trainable_parameters
from dpbench.privatizers.per_sample.layers import SiteMap, handler_for
from dpbench.privatizers.per_sample.recurrent import refuse_unsupported_call
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


def _unflatten_tokens(x: Tensor, g, batch: int) -> tuple[Tensor, object]:
    """A 2-D (B*T, d) input is tokens flattened sample-major (HF OPT's MLP: reshape(-1, d)): back to (B, T, d)."""
    if x.dim() == 2 and isinstance(g, Tensor) and x.shape[0] != batch and x.shape[0] % batch == 0:
        return x.reshape(batch, -1, x.shape[-1]), g.reshape(batch, -1, g.shape[-1])
    return x, g


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
            module.register_forward_hook(self._record, with_kwargs=True)
            for module in model.modules()
            if handler_for(module) is not None and any(p.requires_grad for p in module.parameters(recurse=False))
        ]

    def _record(self, module: nn.Module, args: tuple, kwargs: dict, output: Tensor | tuple) -> None:
        if self._recording and torch.is_grad_enabled():
            refuse_unsupported_call(module, args, kwargs)
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
        output_grads = self._output_grads(losses, [output for _, _, output in records])
        calls_per_param: dict[nn.Parameter, int] = defaultdict(int)
        for module, _, _ in records:
            for p in module.parameters(recurse=False):
                calls_per_param[p] += 1
        sites: dict[str, list[Site]] = defaultdict(list)
        for (module, x, _), g in zip(records, output_grads, strict=True):
            shared = any(calls_per_param[p] > 1 for p in module.parameters(recurse=False))
            for param, site in self.call_sites(module, x, g, losses.shape[0], dense or shared).items():
                sites[self.names[param]].append(site)
        return sites, losses.detach()

    def _output_grads(self, losses: Tensor, outputs: list) -> list:
        """Gradients of the recorded outputs, from one backward that computes no weight gradient."""
        flat = [tree_flatten(output) for output in outputs]  # nn.LSTM returns (output, (h_n, c_n))
        leaves = [leaf for leaves, _ in flat for leaf in leaves]
        leaf_grads = iter(torch.autograd.grad(losses.sum(), leaves, allow_unused=True, materialize_grads=True))
        return [tree_unflatten([next(leaf_grads) for _ in leaves], spec) for leaves, spec in flat]

    def call_sites(self, module: nn.Module, x: Tensor, g, batch: int, dense: bool) -> SiteMap:
        """Sites of one recorded call, after checking that the call saw the whole batch."""
        x, g = _unflatten_tokens(x, g, batch)
        if x.shape[1 if getattr(module, "batch_first", True) is False else 0] != batch:
            raise UnsupportedModelError(
                f"{type(module).__name__} was called on a batch of {x.shape[0]}, not {batch}: its output is "
                "broadcast over the batch (e.g. position ids of shape (1, T)), so per-sample gradients are lost"
            )
        return self.module_sites(module, x.detach(), g, dense)

    def module_sites(self, module: nn.Module, x: Tensor, g: Tensor, dense: bool) -> SiteMap:
        """One recorded call's sites, by parameter: the layer's rule (strategies may transform them, e.g. GRAPE)."""
        return handler_for(module)(module, x, g, dense)

    def per_sample_gradients(self, task: Task, batch: Batch) -> dict[str, Tensor]:
        """Materialized (B, *shape) gradients: for tests and for strategies that transform them."""
        sites, _ = self._sites(task, batch, dense=True)
        return {name: sum(site.materialize() for site in group) for name, group in sites.items()}

    def clipped_sum(
        self, task: Task, batch: Batch, clip_norm: float, factor_fn: FactorFn = clip_factors
    ) -> ClippedSum:
        """sum_i factor_i g_i; factor_fn gives the per-sample factors (default: clip to C; D2P2: automatic)."""
        sites, factors, norms, losses = self.clipped_sites(task, batch, clip_norm, factor_fn)
        grads = {name: sum(site.weighted_sum(factors) for site in group) for name, group in sites.items()}
        for name, param in trainable_parameters(self.model).items():
            if name not in grads:  # not reached by this batch's forward pass: its gradient is zero
                grads[name] = torch.zeros_like(param)
        return ClippedSum(grads=grads, norms=norms, losses=losses)

    def clipped_sites(
        self, task: Task, batch: Batch, clip_norm: float, factor_fn: FactorFn = clip_factors
    ) -> tuple[dict[str, list[Site]], Tensor, Tensor, Tensor]:
        """(sites by parameter name, clipping factors, per-sample norms, losses), non-finite samples zeroed.

        For strategies that sum the clipped gradients their own way (sparse: touched embedding rows only).
        """
        sites, losses = self._sites(task, batch, dense=False)
        norm_sq = torch.zeros(losses.shape[0], device=losses.device)
        for group in sites.values():
            if len(group) == 1:
                norm_sq += group[0].norm_sq()
            else:  # a parameter used at several sites was materialized at each: add the gradients first
                norm_sq += sum(site.materialize() for site in group).flatten(1).pow(2).sum(1)
        norms = norm_sq.sqrt()
        factors = factor_fn(norms, clip_norm)
        bad = ~torch.isfinite(norms)
        if bad.any():
            for group in sites.values():
                for site in group:
                    site.zero_samples(bad)
        return sites, factors, norms, losses
