"""Optimizers from the `optimizer` config group (DP-SGD / DP-Adam share them with the non-private baseline)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from dpbench.core.errors import ConfigurationError


@dataclass
class OptimizerConfig:
    name: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8


def check_optimizer(config: OptimizerConfig) -> None:
    """Refuse before the run what building the optimizer would refuse at its first step (torch's own checks too:
    nesterov without momentum, betas outside [0, 1))."""
    try:
        build_optimizer([nn.Parameter(torch.zeros(1))], config)
    except ValueError as error:
        raise ConfigurationError(f"optimizer={config.name}: {error}") from None


def build_optimizer(params: Iterable[nn.Parameter], config: OptimizerConfig) -> torch.optim.Optimizer:
    params = list(params)
    if config.lr <= 0:
        raise ConfigurationError(f"optimizer.lr must be positive, got {config.lr}")
    if config.name == "sgd":
        return torch.optim.SGD(
            params, lr=config.lr, momentum=config.momentum, nesterov=config.nesterov,
            weight_decay=config.weight_decay,
        )
    if config.name == "adam":
        return torch.optim.Adam(
            params, lr=config.lr, betas=tuple(config.betas), eps=config.eps, weight_decay=config.weight_decay
        )
    if config.name == "adamw":
        return torch.optim.AdamW(
            params, lr=config.lr, betas=tuple(config.betas), eps=config.eps, weight_decay=config.weight_decay
        )
    raise ConfigurationError(f"optimizer.name must be sgd, adam or adamw, got {config.name!r}")
