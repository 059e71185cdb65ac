"""DP-SGD-JL as its tests build it, JL's projections of a small model with the directions it drew, and the same
projections by a per-example loop: the reference that the tangent rules' tests compare against."""

import torch
from omegaconf import OmegaConf
from torch import Tensor, nn

from dpbench.core.tasks import ClassificationTask
from dpbench.privacy.randomness import PrivacyRandomness
from dpbench.privatizers import PrivacySettings, make_strategy
from tests.helpers.per_sample_reference import loop_gradients

TASK = ClassificationTask()


def jl(r: int, sigma: float = 1.0, clip: float = 1.0, chunk_size: int | None = None, seed: int = 0):
    """DP-SGD-JL with r projections (sampling rate 0.1), its draws seeded by `seed`."""
    settings = PrivacySettings(clip, 0.1, sigma, PrivacyRandomness(seed))
    return make_strategy(OmegaConf.create({"name": "jl", "projections": r, "chunk_size": chunk_size}), settings)


def projections(model: nn.Module, batch, chunk_size: int, drawn: list | None = None) -> Tensor:
    """(B, 4) projections by JL's own passes; `drawn` collects each chunk's directions as drawn (copies, so that a
    pass writing into them would show)."""
    strategy = jl(4, chunk_size=chunk_size, seed=5)
    strategy.attach(model)
    if drawn is not None:
        draw = strategy._draw

        def recording(params, count):
            tangents = draw(params, count)
            drawn.append({name: t.clone() for name, t in tangents.items()})
            return tangents

        strategy._draw = recording
    return strategy.projections(model, TASK, batch)[1]


def projections_and_reference(model: nn.Module, batch, chunk_size: int) -> tuple[Tensor, Tensor]:
    """JL's projections and <grad loss_i, v_j> of a per-example loop along the same directions."""
    drawn = []
    projected = projections(model, batch, chunk_size, drawn)
    directions = {name: torch.cat([chunk[name] for chunk in drawn]) for name in drawn[0]}
    reference = torch.stack([sum((grads[name] * directions[name]).flatten(1).sum(1) for name in grads)
                             for grads in loop_gradients(model, batch)])
    return projected, reference
