"""The smallest classification setup a privatized step needs: a classifier of 4x4 one-channel images into 3 classes,
its ClassificationTask and a batch, built the same way every time. The `tiny_task` fixture (tests/conftest.py) hands
out one; tests that build many (Hypothesis examples) call `tiny_classifier` and `tiny_batch` themselves."""

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dpbench.core.tasks import ClassificationTask


@dataclass
class TinyTask:
    model: nn.Module
    task: ClassificationTask
    batch: tuple[Tensor, Tensor]


def tiny_classifier() -> nn.Module:
    """Flatten, Linear(16, 8), tanh, Linear(8, 3), initialised after seeding torch's global generator with 0."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 3))


def tiny_batch(size: int = 6, seed: int = 0) -> tuple[Tensor, Tensor]:
    """`size` random 1x4x4 images and labels in {0, 1, 2}, from a generator of its own seeded with `seed`."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(size, 1, 4, 4, generator=generator), torch.randint(0, 3, (size,), generator=generator)


def tiny_task() -> TinyTask:
    return TinyTask(tiny_classifier(), ClassificationTask(), tiny_batch())
