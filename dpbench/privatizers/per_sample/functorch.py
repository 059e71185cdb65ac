"""Per-sample gradient engine on torch.func: vmap(grad) of the single-sample loss, for any vmap-able model."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap
from torch.utils._pytree import tree_map

from dpbench.privatizers.clipping import FactorFn, clip_factors
from dpbench.privatizers.per_sample.base import ClippedSum, refuse_sample_mixing_layers, trainable_parameters
from dpbench.tasks import Batch, Task


class FunctorchEngine:
    """Materializes (B, *shape) per-sample gradients, in chunks of `chunk_size` samples to cap memory."""

    def __init__(self, model: nn.Module, chunk_size: int | None = None):
        refuse_sample_mixing_layers(model)
        self.model = model
        self.chunk_size = chunk_size

    def per_sample_gradients(self, task: Task, batch: Batch) -> dict[str, Tensor]:
        trainable = {name: p.detach() for name, p in trainable_parameters(self.model).items()}
        frozen = {name: p.detach() for name, p in self.model.named_parameters() if name not in trainable}
        frozen.update(dict(self.model.named_buffers()))

        def sample_loss(params: dict[str, Tensor], inputs, target: Tensor) -> Tensor:
            one = (tree_map(lambda t: t.unsqueeze(0), inputs), target.unsqueeze(0))

            def forward(x):
                return functional_call(self.model, {**params, **frozen}, (x,))

            return task.per_sample_loss(forward, one)[0]

        inputs, targets = batch
        per_sample = vmap(grad(sample_loss), in_dims=(None, 0, 0), randomness="different", chunk_size=self.chunk_size)
        return per_sample(trainable, inputs, targets)

    def clipped_sum(
        self, task: Task, batch: Batch, clip_norm: float, factor_fn: FactorFn = clip_factors
    ) -> ClippedSum:
        """sum_i factor_i g_i; factor_fn gives the per-sample factors (default: clip to C; D2P2: automatic)."""
        per_sample = self.per_sample_gradients(task, batch)
        norms = torch.stack([g.flatten(1).pow(2).sum(1) for g in per_sample.values()]).sum(0).sqrt()
        factors = factor_fn(norms, clip_norm)
        finite = torch.isfinite(norms)
        grads = {}
        for name, g in per_sample.items():
            g = torch.where(finite.view(-1, *([1] * (g.dim() - 1))), g, torch.zeros((), dtype=g.dtype))
            grads[name] = torch.tensordot(factors.to(g.dtype), g, dims=1)
        with torch.no_grad():
            losses = task.per_sample_loss(self.model, batch)
        return ClippedSum(grads=grads, norms=norms, losses=losses)
