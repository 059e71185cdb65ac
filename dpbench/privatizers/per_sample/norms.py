"""Per-sample squared norms summed over parameters, with the Gram of activations that several layers read shared.

Clipping needs only each sample's total norm. Layers that read the same activations A (an attention block's query,
key and value all read one LayerNorm output) have ghost norms <A A^T, G_k G_k^T>, whose sum over the layers is
<A A^T, G G^T> for G their output gradients side by side: one Gram of A and one of G instead of one of each per layer.

A ghost norm that rounding may have moved by more than ILL_CONDITIONED of itself (eps * S^2 against it, sites.py) is
recomputed from the sample's gradient materialized in float64, which the site then also sums from: one host sync a
step finds whether any sample needs it.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import Tensor

from dpbench.privatizers.per_sample.sites import OuterProductSite, Site

ILL_CONDITIONED = 1e-3
"""Largest share of a ghost norm its rounding may move, judged as eps * S^2 against it: beyond it (S / norm above about
90 in float32) the sample is materialized. The weighted sum's own rounding then stays near sqrt(B T) eps S / norm,
5e-4 of the clip norm at B T = 8,500."""

Ghost = tuple[list[OuterProductSite], Tensor, Tensor]
"""Ghost sites sharing one norm, that norm (B,) and its scale S^2 (B,)."""


def _refined(ghosts: list[Ghost]) -> list[Tensor]:
    """Each ghost norm, its ill-conditioned samples' recomputed by their sites from materialized gradients."""
    ill = [value < scale * (torch.finfo(value.dtype).eps / ILL_CONDITIONED) for _, value, scale in ghosts]
    if not ill or not bool(torch.stack([flags.any() for flags in ill]).any()):
        return [value for _, value, _ in ghosts]
    refined = []
    for (sites, value, _), flags in zip(ghosts, ill, strict=True):
        rows = flags.nonzero().flatten()
        if rows.numel():
            value = value.index_put((rows,), sum(site.hold_exact(rows) for site in sites).to(value.dtype))
        refined.append(value)
    return refined


def _single_ghost(group: list[Site]) -> OuterProductSite | None:
    site = group[0]
    return site if len(group) == 1 and isinstance(site, OuterProductSite) and site.exact is None else None


def group_norm_sq(group: list[Site]) -> Tensor:
    """(B,) squared norms of one parameter's per-sample gradients, summed over its sites first when it has several."""
    ghost = _single_ghost(group)
    if ghost is not None:
        return _refined([([ghost], ghost.ghost_norm_sq(), ghost.scale_sq())])[0]
    if len(group) == 1:
        return group[0].norm_sq()
    return sum(site.materialize() for site in group).flatten(1).pow(2).sum(1)


def _memory(tensor: Tensor) -> tuple:
    """Two live tensors with the same key are the same memory read the same way, so they hold the same values."""
    return tensor.device, tensor.dtype, tensor.data_ptr(), tuple(tensor.shape), tensor.stride()


def total_norm_sq(groups: list[list[Site]], zero: Tensor) -> Tensor:
    """(B,) sum over parameters of group_norm_sq, ghost sites that read the same activations sharing one Gram."""
    total = zero
    ghosts: list[Ghost] = []
    shared: dict[tuple, list[OuterProductSite]] = defaultdict(list)
    for group in groups:
        site = _single_ghost(group)
        if site is not None and site.activations.shape[1] > 1 and site.activations.numel():
            shared[(*_memory(site.activations), site.output_grads.dtype)].append(site)
        elif site is not None:
            ghosts.append(([site], site.ghost_norm_sq(), site.scale_sq()))
        else:
            total = total + group_norm_sq(group)
    for sites in shared.values():
        if len(sites) == 1:
            ghosts.append((sites, sites[0].ghost_norm_sq(), sites[0].scale_sq()))
            continue
        a = sites[0].activations
        grams = torch.bmm(sites[0].output_grads, sites[0].output_grads.transpose(1, 2))
        for site in sites[1:]:  # G G^T accumulated: no copy of the output gradients side by side
            grams = torch.baddbmm(grams, site.output_grads, site.output_grads.transpose(1, 2))
        grads_norm = torch.stack([site.output_grads.pow(2).sum(2) for site in sites]).sum(0).sqrt()
        scale = (a.norm(dim=2) * grads_norm).sum(1).pow(2)
        ghosts.append((sites, (torch.bmm(a, a.transpose(1, 2)) * grams).sum((1, 2)), scale))
    for value in _refined(ghosts):
        total = total + value
    return total
