"""Per-sample squared norms summed over parameters, with the Gram of activations that several layers read shared.

Clipping needs only each sample's total norm. Layers that read the same activations A (an attention block's query,
key and value all read one LayerNorm output) have ghost norms <A A^T, G_k G_k^T>, whose sum over the layers is
<A A^T, G G^T> for G their output gradients side by side: one Gram of A and one of G instead of one of each per layer.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import Tensor

from dpbench.privatizers.per_sample.sites import OuterProductSite, Site


def group_norm_sq(group: list[Site]) -> Tensor:
    """(B,) squared norms of one parameter's per-sample gradients, summed over its sites first when it has several."""
    if len(group) == 1:
        return group[0].norm_sq()
    return sum(site.materialize() for site in group).flatten(1).pow(2).sum(1)


def _memory(tensor: Tensor) -> tuple:
    """Two live tensors with the same key are the same memory read the same way, so they hold the same values."""
    return tensor.device, tensor.dtype, tensor.data_ptr(), tuple(tensor.shape), tensor.stride()


def total_norm_sq(groups: list[list[Site]], zero: Tensor) -> Tensor:
    """(B,) sum over parameters of group_norm_sq, ghost sites that read the same activations sharing one Gram."""
    total = zero
    shared: dict[tuple, list[OuterProductSite]] = defaultdict(list)
    for group in groups:
        site = group[0]
        if len(group) == 1 and isinstance(site, OuterProductSite) and site.activations.shape[1] > 1 \
                and site.activations.numel():
            shared[(*_memory(site.activations), site.output_grads.dtype)].append(site)
        else:
            total = total + group_norm_sq(group)
    for sites in shared.values():
        if len(sites) == 1:
            total = total + sites[0].norm_sq()
            continue
        a = sites[0].activations
        grams = torch.bmm(sites[0].output_grads, sites[0].output_grads.transpose(1, 2))
        for site in sites[1:]:  # G G^T accumulated: no copy of the output gradients side by side
            grams = torch.baddbmm(grams, site.output_grads, site.output_grads.transpose(1, 2))
        total = total + (torch.bmm(a, a.transpose(1, 2)) * grams).sum((1, 2))
    return total
