"""Gaussian noise from a dedicated generator (never the global RNG), once per logical step."""

from __future__ import annotations

import torch
from torch import Tensor


class GaussianNoise:
    """Seeded per run; its state travels in checkpoints so a resumed run draws the same noise."""

    def __init__(self, seed: int, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

    def to(self, device: torch.device) -> None:
        if torch.device(device) != self.device:
            state = self.generator.initial_seed()
            self.device = torch.device(device)
            self.generator = torch.Generator(device=self.device).manual_seed(state)

    def sample_like(self, reference: Tensor, std: float) -> Tensor:
        noise = torch.randn(reference.shape, generator=self.generator, device=self.device, dtype=reference.dtype)
        return noise.mul_(std)

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "device": str(self.device)}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
