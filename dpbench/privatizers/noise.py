"""Gaussian noise from a dedicated generator (never the global RNG), once per logical step.

`secure=True` draws from the operating system's CSPRNG (os.urandom) through Box-Muller in float64: slower, not
reproducible, and immune to an attacker who could otherwise predict a seeded PRNG's stream.
"""

from __future__ import annotations

import math
import os

import torch
from torch import Tensor


def _secure_uniform(count: int) -> Tensor:
    """Uniform (0, 1) doubles from 53 random bits each (never exactly 0, so log() is safe)."""
    bits = torch.frombuffer(bytearray(os.urandom(8 * count)), dtype=torch.int64) & ((1 << 53) - 1)
    return (bits.to(torch.float64) + 0.5) / float(1 << 53)


def secure_standard_normal(count: int) -> Tensor:
    """Box-Muller on CSPRNG uniforms."""
    pairs = (count + 1) // 2
    u1, u2 = _secure_uniform(pairs), _secure_uniform(pairs)
    radius = torch.sqrt(-2.0 * torch.log(u1))
    angle = 2.0 * math.pi * u2
    return torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)])[:count]


class GaussianNoise:
    """Seeded per run; its state travels in checkpoints so a resumed run draws the same noise."""

    def __init__(self, seed: int, device: torch.device | str = "cpu", secure: bool = False):
        self.device = torch.device(device)
        self.secure = secure
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

    def to(self, device: torch.device) -> None:
        if torch.device(device) != self.device:
            state = self.generator.initial_seed()
            self.device = torch.device(device)
            self.generator = torch.Generator(device=self.device).manual_seed(state)

    def sample_like(self, reference: Tensor, std: float) -> Tensor:
        if self.secure:
            noise = secure_standard_normal(reference.numel()).view(reference.shape)
            return noise.to(device=reference.device, dtype=reference.dtype).mul_(std)
        noise = torch.randn(reference.shape, generator=self.generator, device=self.device, dtype=reference.dtype)
        return noise.mul_(std)

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "device": str(self.device)}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
