"""D2P2's explicit random projection (privatizer.projection=explicit; the default samples the update without it, see
implicit_projection.py): one Gaussian matrix A (d x p, iid N(0, 1) entries) over all trainable parameters.

A is never held whole. Its rows belong to the parameters in order (the layer-wise split of Algorithm 1), and each
parameter's rows are cut into blocks of at most `max_block_elements` entries, each regenerated on demand from its
own key (step, parameter, block) of the run's secret randomness: memory O(block), time O(d p) per pass,
and the global RNG is never touched. Because every column of A is N(0, I_d) over *all* coordinates, A^T g is
N(0, ||g||^2 I_p) for any fixed g, which is what the chi-square accounting assumes (a block-diagonal, per-layer
matrix would not give that law).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor

from dpbench.core.errors import ConfigurationError
from dpbench.privacy.randomness import PrivacyRandomness


class GaussianProjection:
    """x -> A^T vec(x) / sqrt(p) and y -> A y / sqrt(p) with the step's A; E[A A^T] / p = I, so back(project(g))
    is an unbiased estimate of g."""

    def __init__(self, shapes: dict[str, torch.Size], dim: int, randomness: PrivacyRandomness, max_block_elements: int):
        if dim < 1:
            raise ConfigurationError(f"privatizer.dim (the projection dimension p) must be positive, got {dim}")
        if max_block_elements < dim:
            raise ConfigurationError(f"privatizer.max_block_elements must be at least dim={dim}")
        self.shapes = {name: torch.Size(shape) for name, shape in shapes.items()}
        self.dim = dim
        self.randomness = randomness
        self.rows_per_block = max_block_elements // dim

    def blocks(
        self, step: int, device: torch.device, names: set[str] | None = None
    ) -> Iterator[tuple[str, slice, Tensor]]:
        """(parameter name, its rows of A, the (rows, p) block) for every block of the step's A (or of `names`)."""
        for index, (name, shape) in enumerate(self.shapes.items()):
            if names is not None and name not in names:
                continue
            for block, start in enumerate(range(0, shape.numel(), self.rows_per_block)):
                rows = slice(start, min(start + self.rows_per_block, shape.numel()))
                draws = self.randomness.draws("d2p2", step, index, block, device=device)
                yield name, rows, draws.normal((rows.stop - rows.start, self.dim))

    def project(self, tensors: dict[str, Tensor], step: int) -> Tensor:
        """A^T vec(x) / sqrt(p): tensors shaped like their parameters give (p,), per-sample (B, *shape) give (B, p).

        Missing parameters count as zero.
        """
        reference = next(iter(tensors.values()))
        lead = reference.dim() - len(self.shapes[next(iter(tensors))])
        flat = {name: t.reshape(*t.shape[:lead], -1).float() for name, t in tensors.items()}
        out = torch.zeros(*reference.shape[:lead], self.dim, device=reference.device)
        for name, rows, block in self.blocks(step, reference.device, set(flat)):
            out += flat[name][..., rows] @ block
        return out / math.sqrt(self.dim)

    def back(self, projected: Tensor, step: int) -> dict[str, Tensor]:
        """A y / sqrt(p) for y of shape (p,), by parameter name and shape (float32)."""
        out = {name: torch.empty(shape.numel(), device=projected.device) for name, shape in self.shapes.items()}
        y = projected.float() / math.sqrt(self.dim)
        for name, rows, block in self.blocks(step, projected.device):
            out[name][rows] = block @ y
        return {name: flat.view(self.shapes[name]) for name, flat in out.items()}
