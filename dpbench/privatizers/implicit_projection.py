"""D2P2's projected update drawn from its exact law without forming the d x p matrix (privatizer.projection=implicit).

With clipping before projection a step releases only u = A (A^T s / sqrt(p) + z) / sqrt(p): s the clipped sum, A a
d x p matrix of iid N(0, 1) entries that nobody sees, z ~ N(0, tau^2 I_p). Split each column of A along
s_hat = s / ||s||: a_j = t_j s_hat + a_j', with t_j ~ N(0, 1) independent of a_j' ~ N(0, I - s_hat s_hat^T). Then

    A A^T s = ||s|| (||t||^2 s_hat + sum_j t_j a_j'),    A z = (z . t) s_hat + sum_j z_j a_j',

so u = alpha s_hat + sum_j c_j a_j' with alpha = ||s|| ||t||^2 / p + (z . t) / sqrt(p), c = ||s|| t / p + z / sqrt(p);
given (t, z) the sum is ||c|| times one N(0, I - s_hat s_hat^T) vector, w - (w . s_hat) s_hat with w ~ N(0, I_d).
Drawing t, z (p entries each) and w (d entries) samples u exactly, in O(d + p) time and memory instead of O(d p).
For s = 0 (an empty batch) s_hat = 0 gives u = ||z|| w / sqrt(p), the law of A z / sqrt(p). The output's law given
the data is the explicit path's, so the privacy (and the accounting, docs/d2p2-accounting.md) is the same.

t and w come from the run's noise generator, like z: fresh on every call. Unlike A, they must never be reused
for another sum (a fixed A with fresh z is still a Gaussian mechanism; fixed t and w are not), so they are not
derived from (seed, step).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from dpbench.core.errors import ConfigurationError
from dpbench.privacy.randomness import PrivateStream


def _dot(left: dict[str, Tensor], right: dict[str, Tensor], device: torch.device) -> Tensor:
    """<left, right> over the names both hold, in left's order (a fixed summation order), as a 0-dim tensor."""
    total = torch.zeros((), device=device)
    for name, values in left.items():
        if name in right:
            total = total + torch.dot(values.reshape(-1), right[name].reshape(-1))
    return total


class ImplicitProjection:
    """u = A (A^T s / sqrt(p) + z) / sqrt(p) for a fresh A every call, sampled without A (see the module docstring)."""

    def __init__(self, shapes: dict[str, torch.Size], dim: int):
        if dim < 1:
            raise ConfigurationError(f"privatizer.dim (the projection dimension p) must be positive, got {dim}")
        self.shapes = {name: torch.Size(shape) for name, shape in shapes.items()}
        self.dim = dim

    def release(
        self, sums: dict[str, Tensor], noise: PrivateStream, std: float, device: torch.device
    ) -> dict[str, Tensor]:
        """u for the clipped sum s (by parameter name, missing parameters count as zero), by parameter name and shape
        (float32). z ~ N(0, std^2 I_p), then t and w, are drawn from `noise` (seeded, checkpointed; secure_rng
        honoured) in that order."""
        draws = noise.on(device)
        z = draws.normal((self.dim,)).mul_(std)
        t = draws.normal((self.dim,))
        s = {name: tensor.float() for name, tensor in sums.items() if name in self.shapes}
        s_norm = _dot(s, s, device).sqrt()
        inverse = torch.where(s_norm > 0, 1 / s_norm, 0.0)  # s_hat = s * inverse, the zero vector when s = 0
        alpha = s_norm * t.dot(t) / self.dim + z.dot(t) / math.sqrt(self.dim)
        c_norm = (s_norm * t / self.dim + z / math.sqrt(self.dim)).norm()
        w = {name: draws.normal(shape) for name, shape in self.shapes.items()}
        along = _dot(w, s, device) * inverse  # w . s_hat
        coefficient = (alpha - c_norm * along) * inverse  # u = c_norm w + coefficient s
        for name, values in w.items():
            values.mul_(c_norm)
            if name in s:
                values.addcmul_(s[name], coefficient)
        return w
