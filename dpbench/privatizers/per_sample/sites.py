"""Per-sample gradients of one layer call, from its input activations A and output gradients G.

Each site gives, per parameter, the per-sample squared norms and the sum of per-sample gradients weighted by the
clipping factors. "Ghost" sites never build the B x out x in per-sample gradient (Li et al. 2021, Bu et al. 2022):
the norm comes from the Gram matrices of A and G and the weighted sum from one matmul. Dense sites hold the
per-sample gradient, which is cheaper when the sequence (or spatial) length T is large next to the layer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor


def _zero_rows(tensor: Tensor, bad: Tensor) -> Tensor:
    return torch.where(bad.view(-1, *([1] * (tensor.dim() - 1))), torch.zeros((), dtype=tensor.dtype), tensor)


class Site(ABC):
    """Per-sample gradient of one parameter at one call site."""

    @abstractmethod
    def norm_sq(self) -> Tensor:
        """(B,) squared norms of the per-sample gradients."""

    @abstractmethod
    def weighted_sum(self, factors: Tensor) -> Tensor:
        """sum_i factors_i * g_i, shaped like the parameter."""

    @abstractmethod
    def materialize(self) -> Tensor:
        """(B, *param.shape) per-sample gradients."""

    @abstractmethod
    def zero_samples(self, bad: Tensor) -> None:
        """Make the samples flagged in `bad` contribute nothing (non-finite gradients)."""


class DenseSite(Site):
    def __init__(self, per_sample: Tensor):
        self.per_sample = per_sample

    def norm_sq(self) -> Tensor:
        return self.per_sample.flatten(1).pow(2).sum(1)

    def weighted_sum(self, factors: Tensor) -> Tensor:
        return torch.tensordot(factors.to(self.per_sample.dtype), self.per_sample, dims=1)

    def materialize(self) -> Tensor:
        return self.per_sample

    def zero_samples(self, bad: Tensor) -> None:
        self.per_sample = _zero_rows(self.per_sample, bad)


class OuterProductSite(Site):
    """Weight of a linear map applied at T positions: g_i = sum_t G_it A_it^T, A (B,T,in), G (B,T,out).

    Its ghost norm sum_ts (A_it . A_is)(G_it . G_is) cancels where the tokens' terms do, and its rounding error is
    about eps * S_i^2 (S_i = sum_t ||A_it|| ||G_it||) however small the norm: a record of two tokens +1e5 u and
    -1e5 u + v was clipped by a tenth of its norm in float32 (its contribution 1.8 C). norms.py finds such samples
    (`scale_sq`) and has the site hold their gradients materialized in float64 (`hold_exact`): their norms and their
    share of the weighted sum then come from the same tensor, so what is added is what was clipped.
    """

    def __init__(self, activations: Tensor, output_grads: Tensor, shape: torch.Size):
        self.activations = activations
        self.output_grads = output_grads
        self.shape = shape
        self.exact: tuple[Tensor, Tensor] | None = None
        """(rows, their (k, *shape) float64 gradients): the samples held materialized."""

    def ghost_norm_sq(self) -> Tensor:
        a, g = self.activations, self.output_grads
        if a.shape[1] == 1:
            return a.pow(2).sum((1, 2)) * g.pow(2).sum((1, 2))
        return (torch.bmm(a, a.transpose(1, 2)) * torch.bmm(g, g.transpose(1, 2))).sum((1, 2))

    def norm_sq(self) -> Tensor:
        norms = self.ghost_norm_sq()
        if self.exact is None:
            return norms
        rows, grads = self.exact
        return norms.index_put((rows,), grads.flatten(1).pow(2).sum(1).to(norms.dtype))

    def scale_sq(self) -> Tensor:
        """(B,) S^2: the ghost norm's rounding error is about eps * S^2 (at one position none: no cancellation)."""
        if self.activations.shape[1] == 1:
            return torch.zeros(self.activations.shape[0], dtype=self.activations.dtype,
                               device=self.activations.device)
        return (self.activations.norm(dim=2) * self.output_grads.norm(dim=2)).sum(1).pow(2)

    def hold_exact(self, rows: Tensor) -> Tensor:
        """Hold the gradients of `rows` materialized in float64 from now on; returns their squared norms."""
        grads = torch.bmm(self.output_grads[rows].double().transpose(1, 2), self.activations[rows].double())
        self.exact = (rows, grads)
        return grads.flatten(1).pow(2).sum(1)

    def weighted_sum(self, factors: Tensor) -> Tensor:
        a, g = self.activations, self.output_grads
        ghost_factors = factors if self.exact is None else factors.index_fill(0, self.exact[0], 0)
        scaled = g * ghost_factors.to(g.dtype).view(-1, 1, 1)
        total = (scaled.reshape(-1, g.shape[-1]).T @ a.reshape(-1, a.shape[-1])).view(self.shape)
        if self.exact is None:
            return total
        rows, grads = self.exact
        return total + torch.tensordot(factors[rows].double(), grads, dims=1).view(self.shape).to(total.dtype)

    def materialize(self) -> Tensor:
        per_sample = torch.bmm(self.output_grads.transpose(1, 2), self.activations)
        if self.exact is not None:
            rows, grads = self.exact
            per_sample = per_sample.index_put((rows,), grads.to(per_sample.dtype))
        return per_sample.view(-1, *self.shape)

    def zero_samples(self, bad: Tensor) -> None:
        self.activations = _zero_rows(self.activations, bad)
        self.output_grads = _zero_rows(self.output_grads, bad)
        if self.exact is not None:
            rows, grads = self.exact
            self.exact = (rows, _zero_rows(grads, bad[rows]))


class EmbeddingSite(Site):
    """Embedding rows: g_i[v] = sum_{t: ids_it = v} G_it. Each sample's positions are summed per distinct id once
    (`rows`), and its norm and its share of the weighted sum both come from those sums, so what is added is what was
    clipped. The same-token Gram used before, sum_ts [ids_it = ids_is] G_it . G_is, cancelled in float32 where a
    record's positions of one id had opposite gradients: one record's contribution reached 129 C (review,
    2026-11-28). The sums also cost B T d against the Gram's B T^2 d."""

    def __init__(self, ids: Tensor, output_grads: Tensor, num_embeddings: int):
        self.ids = ids  # (B, T)
        self.output_grads = output_grads  # (B, T, d)
        self.num_embeddings = num_embeddings
        self._rows: tuple[Tensor, Tensor, Tensor] | None = None

    def rows(self) -> tuple[Tensor, Tensor, Tensor]:
        """(sample, id, summed gradient) of every (sample, id) pair the batch holds."""
        if self._rows is None:
            batch, length = self.ids.shape
            samples = torch.arange(batch, device=self.ids.device).repeat_interleave(length)
            pairs, inverse = torch.unique(samples * self.num_embeddings + self.ids.reshape(-1), return_inverse=True)
            g = self.output_grads.reshape(-1, self.output_grads.shape[-1])
            sums = torch.zeros(pairs.shape[0], g.shape[1], dtype=g.dtype, device=g.device).index_add_(0, inverse, g)
            self._rows = (pairs // self.num_embeddings, pairs % self.num_embeddings, sums)
        return self._rows

    def norm_sq(self) -> Tensor:
        samples, _, sums = self.rows()
        norms = torch.zeros(self.ids.shape[0], dtype=sums.dtype, device=sums.device)
        return norms.index_add_(0, samples, sums.pow(2).sum(1))

    def weighted_rows(self, factors: Tensor) -> tuple[Tensor, Tensor]:
        """(ids, factor_i times each summed row): the weighted sum before rows of one id are added up."""
        samples, ids, sums = self.rows()
        return ids, sums * factors.to(sums.dtype)[samples].unsqueeze(1)

    def weighted_sum(self, factors: Tensor) -> Tensor:
        ids, values = self.weighted_rows(factors)
        out = torch.zeros(self.num_embeddings, values.shape[1], dtype=values.dtype, device=values.device)
        return out.index_add_(0, ids, values)

    def materialize(self) -> Tensor:
        samples, ids, sums = self.rows()
        out = torch.zeros(self.ids.shape[0], self.num_embeddings, sums.shape[1], dtype=sums.dtype,
                          device=sums.device)
        return out.index_put_((samples, ids), sums)

    def zero_samples(self, bad: Tensor) -> None:
        self.output_grads = _zero_rows(self.output_grads, bad)
        self._rows = None
