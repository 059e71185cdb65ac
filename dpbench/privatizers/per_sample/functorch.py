"""Per-sample gradient engine on torch.func: vmap(grad) of the single-sample loss, for models the hooks cannot serve.

While vmap runs, the model is made traceable (vmap_traceable.py): recurrent layers as plain tensor ops, Hugging Face
attention masks always materialized, math attention. A model vmap still cannot trace (a branch on a value, a
data-dependent shape) gets an exact per-example loop instead, with a warning: slower, never wrong.
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap
from torch.utils._pytree import tree_map

from dpbench.core.tasks import Batch, Task
from dpbench.privatizers.clipping import FactorFn, clip_factors
from dpbench.privatizers.per_sample.base import ClippedSum, refuse_sample_mixing_layers, trainable_parameters
from dpbench.privatizers.per_sample.precision import model_forward
from dpbench.privatizers.per_sample.vmap_traceable import vmap_traceable

log = logging.getLogger(__name__)


class FunctorchEngine:
    """Materializes (B, *shape) per-sample gradients, in chunks of `chunk_size` samples to cap memory."""

    def __init__(self, model: nn.Module, chunk_size: int | None = None):
        refuse_sample_mixing_layers(model)
        self.model = model
        self.chunk_size = chunk_size
        self.per_example_loop = False
        """Set once vmap has failed on this model: later steps go straight to the loop."""

    def per_sample_gradients(self, task: Task, batch: Batch) -> dict[str, Tensor]:
        trainable = {name: p.detach() for name, p in trainable_parameters(self.model).items()}
        frozen = {name: p.detach() for name, p in self.model.named_parameters() if name not in trainable}
        frozen.update(dict(self.model.named_buffers()))

        def sample_loss(params: dict[str, Tensor], inputs, target: Tensor) -> Tensor:
            one = (tree_map(lambda t: t.unsqueeze(0), inputs), target.unsqueeze(0))

            def forward(x):
                return functional_call(self.model, {**params, **frozen}, (x,))

            with model_forward():
                return task.per_sample_loss(forward, one)[0]

        inputs, targets = batch
        if not self.per_example_loop:
            per_sample = vmap(grad(sample_loss), in_dims=(None, 0, 0), randomness="different",
                              chunk_size=self.chunk_size)
            try:
                with vmap_traceable(self.model):
                    return per_sample(trainable, inputs, targets)
            except torch.OutOfMemoryError:
                raise  # privatizer.chunk_size bounds vmap's memory
            except (RuntimeError, NotImplementedError) as error:
                reason = str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
                log.warning("vmap cannot trace %s (%s): per-sample gradients now come from an exact per-example "
                            "loop, one forward and backward per sample (slower)", type(self.model).__name__, reason)
                self.per_example_loop = True
        return looped_per_sample_gradients(grad(sample_loss), trainable, inputs, targets)

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
        with torch.no_grad(), model_forward():
            losses = task.per_sample_loss(self.model, batch)
        return ClippedSum(grads=grads, norms=norms, losses=losses)


def looped_per_sample_gradients(sample_grad, params: dict[str, Tensor], inputs, targets: Tensor) -> dict[str, Tensor]:
    """sample_grad(params, inputs_i, target_i) for each sample in turn, stacked: what vmap would have batched."""
    grads = [sample_grad(params, tree_map(lambda t, i=i: t[i], inputs), targets[i]) for i in range(targets.shape[0])]
    return {name: torch.stack([g[name] for g in grads]) for name in params}
