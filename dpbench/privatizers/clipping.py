"""Per-sample clipping factors, with non-finite samples dropped so the sensitivity bound still holds."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

STABILITY = 1e-6

FactorFn = Callable[[Tensor, float], Tensor]
"""(per-sample norms, C) -> per-sample factors whose scaled gradients have norm at most C."""


def clip_factors(norms: Tensor, clip_norm: float) -> Tensor:
    """min(1, C / ||g_i||); zero for samples whose norm is NaN or inf (they contribute nothing)."""
    factors = (clip_norm / (norms + STABILITY)).clamp(max=1.0)
    return torch.where(torch.isfinite(norms), factors, torch.zeros_like(factors))


def automatic_clip_factors(norms: Tensor, clip_norm: float, gamma: float) -> Tensor:
    """C / (||g_i|| + gamma) (Bu et al.'s automatic clipping): every contribution has norm below C, none is zero."""
    factors = clip_norm / (norms + gamma)
    return torch.where(torch.isfinite(norms), factors, torch.zeros_like(factors))


def clipping_stats(norms: Tensor, clip_norm: float) -> dict[str, float]:
    """Fraction clipped, mean norm and non-finite count, read back in one device sync."""
    if norms.numel() == 0:
        return {"batch_size": 0.0}
    finite = torch.isfinite(norms)
    safe = torch.where(finite, norms, torch.zeros_like(norms))
    count = finite.sum().clamp(min=1)
    values = torch.stack([(safe > clip_norm).sum() / count, safe.sum() / count, (~finite).sum().to(norms.dtype)])
    clipped, mean_norm, nonfinite = values.tolist()
    return {
        "batch_size": float(norms.numel()),
        "clipped_fraction": clipped,
        "grad_norm_mean": mean_norm,
        "nonfinite_samples": nonfinite,
    }
