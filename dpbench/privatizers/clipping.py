"""Per-sample clipping factors, with non-finite samples dropped so the sensitivity bound still holds."""

from __future__ import annotations

import torch
from torch import Tensor

STABILITY = 1e-6


def clip_factors(norms: Tensor, clip_norm: float) -> Tensor:
    """min(1, C / ||g_i||); zero for samples whose norm is NaN or inf (they contribute nothing)."""
    factors = (clip_norm / (norms + STABILITY)).clamp(max=1.0)
    return torch.where(torch.isfinite(norms), factors, torch.zeros_like(factors))


def clipping_stats(norms: Tensor, clip_norm: float) -> dict[str, float]:
    if norms.numel() == 0:
        return {"batch_size": 0.0}
    finite = torch.isfinite(norms)
    finite_norms = norms[finite]
    stats = {
        "batch_size": float(norms.numel()),
        "clipped_fraction": float((finite_norms > clip_norm).float().mean()) if finite_norms.numel() else 0.0,
        "grad_norm_median": float(finite_norms.median()) if finite_norms.numel() else float("nan"),
        "nonfinite_samples": float((~finite).sum()),
    }
    return stats
