"""Models whose per-sample gradients only training shows to be wrong under module hooks: what the engines' checks
during training must catch. `model=gated` with `--config-dir tests/conf` builds the gated one through the CLI."""

import math
from dataclasses import dataclass

import torch
from torch import nn

from dpbench import DataBundle
from dpbench.models.provenance import built_by_dpbench


class TrainModeCentering(nn.Module):
    """A hand-written batch norm: subtracts (half) the batch mean in training mode only, so an eval-mode check
    passes (half, so that a sample alone still has an input-dependent output)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        h = self.fc(x)
        return h - 0.5 * h.mean(0, keepdim=True) if self.training else h


class GradientOnlyMixing(nn.Module):
    """Every loss is its sample's own, yet each sample's gradient carries the batch mean's: h + a (m - m.detach())
    with m the batch mean of h is h in value and not in gradient."""

    def __init__(self, features: int = 6, strength: float = 5.0):
        super().__init__()
        self.fc, self.strength = nn.Linear(features, 6), strength

    def forward(self, x):
        h = self.fc(x)
        mean = h.mean(0, keepdim=True)
        return h + self.strength * (mean - mean.detach())


class NoiseLayer(nn.Module):
    """Adds a little Gaussian noise (not dropout) and centres over the batch, in training mode only."""

    def __init__(self, features: int = 6):
        super().__init__()
        self.fc = nn.Linear(features, 6)

    def forward(self, x):
        h = self.fc(x)
        return h - h.mean(0, keepdim=True) + 1e-6 * torch.randn_like(h) if self.training else h


class TrainModeStandardizing(TrainModeCentering):
    """Batch statistics in training mode whose per-example value is not finite (the std of one sample)."""

    def forward(self, x):
        h = self.fc(x)
        return (h - h.mean(0, keepdim=True)) / h.std(0, keepdim=True) if self.training else h


class ShapeDependentRounding(nn.Module):
    """Exact per sample, but a batch of one keeps 5 significant bits of its hidden layer: a GPU's kernels for a sample
    alone round otherwise than the batch's (by 0.4% at OPT-1.3B on an H100), which a check must not take for a wrong
    engine. The rounding passes gradients straight through."""

    def __init__(self, features: int, hidden: int, classes: int):
        super().__init__()
        self.first, self.second = nn.Linear(features, hidden), nn.Linear(hidden, classes)

    def forward(self, x):
        h = self.first(x)
        if x.shape[0] == 1:
            mantissa, exponent = torch.frexp(h)
            h = h + (torch.ldexp((mantissa * 32).round() / 32, exponent) - h).detach()
        return self.second(torch.tanh(h))


class GatedSortedBranch(nn.Module):
    """h + gate(branch(h)), the branch layer run on the batch sorted by its first feature and unsorted afterwards (its
    hooked input rows belong to other samples), behind a zero-initialised gate (LoRA's B = 0, ReZero): while the gate
    is 0 the branch's gradients are 0 and a first-batch check sees nothing wrong."""

    def __init__(self, features: int, hidden: int, classes: int):
        super().__init__()
        self.inp = nn.Linear(features, hidden)
        self.branch = nn.Linear(hidden, hidden)
        self.gate = nn.Linear(hidden, hidden, bias=False)
        nn.init.zeros_(self.gate.weight)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        h = torch.tanh(self.inp(x.flatten(1)))
        order = h[:, 0].argsort()
        branch = self.branch(h[order])[order.argsort()]
        return self.head(h + self.gate(torch.tanh(branch)))


@dataclass
class GatedConfig:
    name: str = "gated"
    hidden: int = 16


def build_gated(config: GatedConfig, data: DataBundle) -> nn.Module:
    """Recorded as dpbench-built: it stands for a built-in whose rule is wrong for a layer that wakes late, which
    only the sampled checks (the second line of defence) can catch."""
    return built_by_dpbench(GatedSortedBranch(math.prod(data.input_shape), config.hidden, data.num_classes))
