"""A privatizer from outside dpbench: DP-SGD with per-layer clipping.

Each parameter tensor's per-sample gradient is clipped to C / sqrt(L) (L tensors), so a sample's whole gradient
has norm at most C, and N(0, (sigma C)^2) is added to the sum once per step: the sensitivity and noise of the
default composition, one Poisson-subsampled Gaussian per step, which the built-in accountant therefore bounds.
"""

from dataclasses import dataclass

import torch
from torch.func import functional_call, grad, vmap

from dpbench import PrivatizerStrategy


@dataclass
class PerLayerConfig:
    name: str = "per_layer"


class PerLayerClipping(PrivatizerStrategy):
    name = "per_layer"
    config: PerLayerConfig

    def attach(self, model):
        self.sums = {}

    def accumulate(self, model, task, batch, ctx):
        inputs, targets = batch
        if len(targets) == 0:
            return 0.0, {"batch_size": 0.0}
        params = {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}

        def loss(params, x, y):
            forward = lambda i: functional_call(model, params, (i,))  # noqa: E731
            return task.per_sample_loss(forward, (x[None], y[None])).sum()

        grads = vmap(grad(loss), in_dims=(None, 0, 0))(params, inputs, targets)
        bound = self.privacy.clip_norm / len(grads) ** 0.5
        for name, g in grads.items():
            scale = (bound / (g.flatten(1).norm(dim=1) + 1e-6)).clamp(max=1.0)
            self.sums[name] = self.sums.get(name, 0) + torch.einsum("b,b...->...", scale, g)
        with torch.no_grad():
            total = task.per_sample_loss(model, batch).sum()
        return float(total), {"batch_size": float(len(targets))}

    def finalize(self, model, ctx):
        self.write_noisy_mean(model, self.sums, ctx)
        self.sums = {}
