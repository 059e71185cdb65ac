"""Scores of the one-run audit's attackers: higher means "more likely a member".

Each works on the per-step evidence z[t, k]: the step-t change of canary k's weight column projected on the
canary's direction, in units of one clipped contribution (lr * C / B). An honest run gives
z[t, k] = b[t, k] + N(0, sigma^2), with b[t, k] = 1 when step t sampled canary k (probability q for a member, 0 for
a null canary), and fresh noise and fresh samples every step. Everything the scores need (lr, B, C, sigma, q,
steps per epoch) is in the published results.json.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from dpbench.core.errors import ConfigurationError


def step_evidence(iterates: Tensor, published: dict[str, Any]) -> Tensor:
    """(steps, m) evidence from the (steps + 1, 2, m) canary columns of a run that trained with plain SGD."""
    optimizer = published["config"]["optimizer"]
    if optimizer["name"] != "sgd" or optimizer["momentum"] or optimizer["weight_decay"]:
        raise ConfigurationError("the one-run audit reads steps from plain SGD iterates (no momentum, no decay)")
    along = (iterates[:, 0] - iterates[:, 1]).double() / math.sqrt(2.0)  # descent direction of a label-0 canary
    unit = optimizer["lr"] * published["clip_norm"] / published["batch_size"]
    return along.diff(dim=0) / unit


def _mixture_log_ratio(total: Tensor, copies: int, sigma: float, q: float) -> Tensor:
    """log of P(total | member) / P(total | null) for a sum of `copies` draws that all hold the canary (prob. q)
    or none does: log(1 - q + q exp((2 total - copies) / (2 sigma^2)))."""
    exponent = (2 * total - copies) / (2 * sigma**2)
    return torch.logaddexp(torch.full_like(total, math.log1p(-q)), exponent + math.log(q))


def honest_score(evidence: Tensor, published: dict[str, Any]) -> Tensor:
    """The likelihood-ratio score for fresh Poisson draws and fresh noise each step (the accountant's model)."""
    sigma, q = published["noise_multiplier"], published["sampling_rate"]
    return _mixture_log_ratio(evidence, 1, sigma, q).sum(dim=0)


def replay_score(evidence: Tensor, published: dict[str, Any]) -> Tensor:
    """The likelihood-ratio score if every epoch replays the first epoch's batches: the evidence of the steps at
    the same place in each epoch adds up (noise averages out over E epochs, the canary's contribution does not)."""
    sigma, q = published["noise_multiplier"], published["sampling_rate"]
    epochs = published["epochs"]
    per_epoch = published["steps"] // epochs
    by_place = evidence[: epochs * per_epoch].reshape(epochs, per_epoch, -1).sum(dim=0)
    return _mixture_log_ratio(by_place, epochs, sigma, q).sum(dim=0)


def shadow_score(evidence: Tensor, shadow_evidence: Tensor) -> Tensor:
    """Canary contributions left after subtracting a shadow run of the published config with null canaries only:
    where the noise and the batches derive from what was published, the shadow run draws the same ones and the
    difference counts the steps that sampled each canary exactly."""
    return (evidence - shadow_evidence).sum(dim=0)
