"""Natural user models that leaked past sampled per-sample checks: each mixes samples, or changes itself, only in a
way the first checked step cannot show. `model=NAME` with `--config-dir tests/conf` builds them through the CLI."""

from dataclasses import dataclass

import torch
from torch import nn

from dpbench import DataBundle
from dpbench.models.provenance import built_by_dpbench

FEATURES = 8


class TokenEmbedding(nn.Module):
    """Signs of the features as tokens into an embedding whose rows are renormalised in place as they are looked up
    (nn.Embedding(max_norm=...)): the rows that moved tell which tokens were in the batch."""

    def __init__(self, features: int = FEATURES, classes: int = 2, max_norm: float | None = 1.0):
        super().__init__()
        self.embedding = nn.Embedding(2 * features, 4, max_norm=max_norm)
        self.offsets = torch.arange(features) * 2
        self.fc = nn.Linear(4, classes)

    def forward(self, x):
        tokens = (x > 0).long() + self.offsets
        return self.fc(self.embedding(tokens).mean(1))


class SelfNormalisingLinear(nn.Module):
    """Scales its weight in place by the batch's input magnitude inside forward: a data-dependent parameter update
    that no gradient sees."""

    def __init__(self, features: int = FEATURES, classes: int = 2):
        super().__init__()
        self.fc = nn.Linear(features, classes)

    def forward(self, x):
        with torch.no_grad():
            self.fc.weight.mul_(1 - 1e-3 * x.abs().mean().clamp(max=1))
        return self.fc(x)


class WarmupMixup(nn.Module):
    """Feature mixup across the batch, switched on by the user's loop after a warm-up (`mix = True`)."""

    def __init__(self, features: int = FEATURES, classes: int = 2):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(features, 16), nn.Linear(16, classes)
        self.mix = False

    def forward(self, x):
        h = torch.tanh(self.fc1(x))
        if self.mix and h.shape[0] > 1:
            h = 0.5 * h + 0.5 * h.flip(0)
        return self.fc2(h)


class OutlierCentring(nn.Module):
    """Centres the batch's features only when the batch holds an outlier: a branch a rare record takes."""

    def __init__(self, features: int = FEATURES, classes: int = 2, threshold: float = 6.0):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(features, 16), nn.Linear(16, classes)
        self.threshold = threshold

    def forward(self, x):
        h = self.fc1(x)
        if bool((x.abs() > self.threshold).any()):
            h = h - h.mean(0, keepdim=True)
        return self.fc2(torch.tanh(h))


class ParityScaled(nn.Module):
    """A scale chosen by the parity of the batch's size: every sample's contribution changes with one more record."""

    def __init__(self, features: int = FEATURES, classes: int = 2):
        super().__init__()
        self.fc = nn.Linear(features, classes)

    def forward(self, x):
        return self.fc(x) * (1.0 if x.size(0) % 2 else 0.05)


class SqrtFeatures(nn.Module):
    """sqrt of a projection's magnitude, guarded where it is 0: the forward and the forward-mode estimate are finite
    (where() takes the guarded branch's tangent), but the backward of sqrt at 0 is 0 / 0 and abs passes it on as
    NaN * 0: one record whose features are all 0 (blank pixels) makes its gradient NaN."""

    def __init__(self, features: int = FEATURES, classes: int = 2):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(features, 4, bias=False), nn.Linear(4, classes)

    def forward(self, x):
        s = self.fc1(x).abs()
        return self.fc2(torch.where(s > 0, s.sqrt(), torch.zeros_like(s)))


class FlipMix(nn.Module):
    """An activation that mixes each sample with another of the batch: what a user might swap in mid-run."""

    def forward(self, h):
        return 0.5 * torch.tanh(h) + 0.5 * torch.tanh(h).flip(0)


@dataclass
class UserModelConfig:
    name: str = "user"
    kind: str = "mixup"
    proven: bool = False
    """Record the model as dpbench-built (standing for a built-in with the same op)."""


KINDS = {"embedding": TokenEmbedding, "self_normalising": SelfNormalisingLinear, "mixup": WarmupMixup,
         "outlier": OutlierCentring, "parity": ParityScaled, "sqrt": SqrtFeatures}


class Flattened(nn.Module):
    """An image data set's (C, H, W) samples flattened and cut to FEATURES, for the CLI's embedded data (spread,
    or with `raw` the pixels above the mean, so that a blank patch is exactly 0)."""

    def __init__(self, inner: nn.Module, raw: bool = False):
        super().__init__()
        self.inner, self.raw = inner, raw

    def forward(self, x):
        x = x.flatten(1)[:, 200:200 + FEATURES]
        return self.inner(x.clamp(min=0) if self.raw else x * 4 - 1)


def build_user_model(config: UserModelConfig, data: DataBundle) -> nn.Module:
    inner = KINDS[config.kind](FEATURES, data.num_classes)
    if isinstance(inner, WarmupMixup):
        inner.mix = True  # no loop to switch it on in the CLI: on from the start
    model = Flattened(inner, raw=isinstance(inner, SqrtFeatures))
    return built_by_dpbench(model) if config.proven else model


class RunningScale(nn.Module):
    """Scales its input by the largest |feature| seen so far, read with .item(): vmap cannot trace it, and in the
    per-example loop one sample's value scales the samples after it, and later steps."""

    def __init__(self, features: int = FEATURES, classes: int = 2):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(features, 16), nn.Linear(16, classes)
        self.largest = 5.0

    def forward(self, x):
        if self.training:
            self.largest = max(self.largest, x.abs().max().item())
        return self.fc2(torch.tanh(self.fc1(x / self.largest)))
