"""GRAPE's seeded random projections, and the hook engine that projects per-sample gradients as it forms them.

A weight W of shape m x n (nn.Linear, HF Conv1D) is projected on its smaller side by a Gaussian matrix with
N(0, 1/r) entries: P (m x r) on the left, giving P^T W (r x n), when m <= n; else Q (n x r) on the right, giving
W Q (m x r). E[P P^T] = I, so mapping back with the same matrix is unbiased. Matrices are regenerated from
(window, layer) keys of the run's secret randomness whenever needed, never stored, and change every `update_every`
steps; their stream is separate from the noise's and from the global RNG.

The per-sample gradient of W is sum_t rows_t cols_t^T (rows: output gradients, cols: inputs, for nn.Linear), so
its projection is sum_t (P^T rows_t) cols_t^T or rows_t (Q^T cols_t): the engine projects the (B, T, .) factors
first and never builds the B x m x n per-sample gradient. It does so during the backward pass, layer by layer, so
that the full output gradients of projected layers are never all held at once (the paper's Algorithm 1).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from dpbench.core.errors import ConfigurationError
from dpbench.core.tasks import Batch, Task, batch_size_of
from dpbench.privacy.randomness import PrivacyRandomness
from dpbench.privatizers.per_sample.check_schedule import CheckSchedule
from dpbench.privatizers.per_sample.hooks import Call, HookEngine
from dpbench.privatizers.per_sample.layers import (
    SiteMap,
    handler_for,
    linear_sites,
    matrix_factors,
    outer_product_site,
)
from dpbench.privatizers.per_sample.sites import DenseSite


@dataclass(frozen=True)
class ProjectionSpec:
    index: int
    """Position among the projected weights: part of the key."""
    shape: tuple[int, int]
    rank: int

    @property
    def left(self) -> bool:
        """Project the rows (m <= n) or the columns."""
        return self.shape[0] <= self.shape[1]

    @property
    def projected_shape(self) -> tuple[int, int]:
        return (self.rank, self.shape[1]) if self.left else (self.shape[0], self.rank)


def projectable_weights(model: nn.Module, rank: int) -> list[tuple[str, nn.Parameter]]:
    """Trainable weights of matrix layers larger than the rank on both sides, owned by one module only."""
    owners: dict[nn.Parameter, int] = {}
    for module in model.modules():
        for param in module.parameters(recurse=False):
            owners[param] = owners.get(param, 0) + 1
    names = {param: name for name, param in model.named_parameters()}
    weights = []
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if handler_for(module) is not linear_sites or not isinstance(weight, nn.Parameter):
            continue
        if weight.requires_grad and owners[weight] == 1 and min(weight.shape) > rank:
            weights.append((names[weight], weight))
    return weights


def refuse_nothing_projected(model: nn.Module, rank: int, privatizer: str) -> None:
    """A projecting method that projects no weight of the model trains plain DP-Adam under its own name."""
    if projectable_weights(model, rank):
        return
    names = {param: name for name, param in model.named_parameters()}
    matrices = sorted(((min(module.weight.shape), names[module.weight], tuple(module.weight.shape))
                       for module in model.modules()
                       if handler_for(module) is linear_sites and isinstance(getattr(module, "weight", None),
                                                                              nn.Parameter)
                       and module.weight.requires_grad), reverse=True)
    largest = (f"; its largest matrix weight is {matrices[0][1]} {'x'.join(map(str, matrices[0][2]))}: "
               f"privatizer.rank={max(1, matrices[0][0] - 1)} or lower projects it" if matrices
               else "; it has no trainable matrix layer (nn.Linear or Conv1D) at all")
    raise ConfigurationError(
        f"privatizer={privatizer} projects no weight of this model at privatizer.rank={rank} (a weight is projected "
        f"when both its sides exceed the rank){largest}. As it stands the run would train plain DP-Adam under the "
        f"name of {privatizer}: lower the rank, or run privatizer=vanilla optimizer=adam"
    )


def projected_adam_state_bytes(model: nn.Module, rank: int) -> int:
    """Projected Adam's two moments: in the projected space for a projected weight, full size for the rest."""
    projected = {id(weight) for _, weight in projectable_weights(model, rank)}
    total = 0
    for param in model.parameters():
        if not param.requires_grad:
            continue
        numel = param.numel()
        if id(param) in projected:
            numel = math.prod(ProjectionSpec(0, tuple(param.shape), rank).projected_shape)
        total += 2 * numel * param.element_size()
    return total


def projection_details(model: nn.Module, rank: int, update_every: int | None) -> dict[str, Any]:
    """Which weights a projecting method projects, at which rank; every other parameter is clipped exactly."""
    projected = dict(projectable_weights(model, rank))
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    return {
        "rank": rank,
        **({"update_every": update_every} if update_every is not None else {}),
        "projected": {name: list(weight.shape) for name, weight in projected.items()},
        "projected_parameters": sum(weight.numel() for weight in projected.values()),
        "exact_parameters": sum(p.numel() for name, p in trainable if name not in projected),
    }


class Projector:
    """Maps projected weights to and from their low-dimensional space with one (k, r) matrix per weight."""

    specs: dict[nn.Parameter, ProjectionSpec]

    def matrix(self, weight: nn.Parameter) -> Tensor:
        raise NotImplementedError

    def project(self, weight: nn.Parameter, full: Tensor) -> Tensor:
        """P^T W or W Q of a weight-shaped (or (B, m, n)) tensor: the reference the engine must agree with."""
        matrix = self.matrix(weight)
        return matrix.T @ full if self.specs[weight].left else full @ matrix

    def back(self, weight: nn.Parameter, projected: Tensor, start: int = 0, stop: int | None = None) -> Tensor:
        """Map a projected-space tensor back to the weight's space with the same matrix: P R or R Q^T (its rows
        start:stop only, for a rank's shard)."""
        matrix = self.matrix(weight)
        if self.specs[weight].left:
            return matrix[start:stop] @ projected
        return projected[start:stop] @ matrix.T


class RandomProjections(Projector):
    """The projection of every projected weight at the current step (set `step` before using)."""

    def __init__(self, model: nn.Module, rank: int, update_every: int, randomness: PrivacyRandomness):
        if rank <= 0:
            raise ConfigurationError(f"privatizer.rank must be positive, got {rank}")
        if update_every <= 0:
            raise ConfigurationError(f"privatizer.update_every must be positive, got {update_every}")
        self.rank, self.update_every, self.randomness = rank, update_every, randomness
        self.specs: dict[nn.Parameter, ProjectionSpec] = {
            weight: ProjectionSpec(index, tuple(weight.shape), rank)
            for index, (_, weight) in enumerate(projectable_weights(model, rank))
        }
        self.step = 0

    @property
    def window(self) -> int:
        return self.step // self.update_every

    def matrix(self, weight: nn.Parameter) -> Tensor:
        """(k, r) Gaussian with N(0, 1/r) entries, k the projected side: regenerated from its key on every call."""
        spec = self.specs[weight]
        side = spec.shape[0] if spec.left else spec.shape[1]
        draws = self.randomness.draws("grape", self.window, spec.index, device=weight.device)
        matrix = draws.normal((side, spec.rank), weight.dtype)
        return matrix.mul_(1.0 / math.sqrt(spec.rank))


class _Tap(torch.autograd.Function):
    """In-place identity on a layer output whose backward hands the output gradient to a callback once it is known.

    Its second input, a scalar anchor, is what the backward asks a gradient for, so autograd runs every tap (and
    frees each full output gradient once the callback has projected it) without computing any weight gradient. The
    output is marked dirty rather than viewed, so the model may still modify it in place (nn.ReLU(inplace=True)):
    the tap sees the gradient of the value the layer produced.
    """

    @staticmethod
    def forward(ctx, output: Tensor, anchor: Tensor, callback) -> Tensor:
        ctx.callback, ctx.anchor = callback, (anchor.dtype, anchor.device)
        ctx.mark_dirty(output)
        return output

    @staticmethod
    def backward(ctx, grad: Tensor):
        ctx.callback(grad)
        dtype, device = ctx.anchor
        return grad, torch.zeros((), dtype=dtype, device=device), None


class ProjectedHookEngine(HookEngine):
    """The hook engine, with the weights of `projections` projected from their activations and output gradients.

    Projected layers are streamed: their output gradient is projected during the backward pass (through a tap on
    the output) and only the projected factor is kept, instead of every layer's full output gradient at once. The
    first batch is checked against per-example gradients projected with the same matrices (Projector.project).
    """

    def __init__(self, model: nn.Module, projections: RandomProjections, checks: CheckSchedule | None = None):
        super().__init__(model, checks)
        self.projections = projections
        self._taps: list[Call | None] = []
        self._streamed: list[SiteMap] = []

    def _record(self, module: nn.Module, args: tuple, kwargs: dict, output):
        weight = getattr(module, "weight", None)
        if not (self._recording and torch.is_grad_enabled() and weight in self.projections.specs):
            return super()._record(module, args, kwargs, output)
        self._taps.append(self._call(module, args, kwargs, output))
        return _Tap.apply(output, self._anchor, partial(self._on_output_grad, len(self._taps) - 1))

    def _on_output_grad(self, index: int, g: Tensor) -> None:
        call = self._taps[index]
        self._taps[index] = None  # the sites keep what they need (A Q instead of A on the right)
        dense = self._dense or self._tap_counts[call.module] > 1
        self._streamed.append(self.call_sites(call.module, call.input, g, self._batch, dense))

    def _collect(self, task: Task, batch: Batch, dense: bool, checked: Counter | None):
        device = next(iter(self.projections.specs), torch.zeros(())).device
        self._anchor = torch.zeros((), device=device, requires_grad=True)
        self._taps, self._streamed, self._dense, self._batch = [], [], dense, batch_size_of(batch)
        try:
            return super()._collect(task, batch, dense, checked)
        finally:
            self._taps, self._streamed = [], []

    def _streamed_sites(self) -> list[SiteMap]:
        return self._streamed

    def _check_calls(self, losses: Tensor, calls: list[Call], checked: Counter | None) -> Counter:
        self._tap_counts = Counter(call.module for call in self._taps)
        return super()._check_calls(losses, [*calls, *self._taps], checked)

    def _output_grads(self, losses: Tensor, calls: list[Call], anchors: Iterable = ()) -> list:
        return super()._output_grads(losses, calls, [*anchors, self._anchor])

    def reference(self, param: nn.Parameter, grad: Tensor) -> Tensor:
        return self.projections.project(param, grad) if param in self.projections.specs else grad

    def module_sites(self, module: nn.Module, x: Tensor, g: Tensor, dense: bool) -> SiteMap:
        weight = getattr(module, "weight", None)
        if weight not in self.projections.specs:
            return super().module_sites(module, x, g, dense)
        spec = self.projections.specs[weight]
        rows, cols = matrix_factors(module, x, g)
        matrix = self.projections.matrix(weight).to(rows.dtype)
        if spec.left:
            rows = rows @ matrix
        else:
            cols = cols @ matrix
        sites: SiteMap = {weight: outer_product_site(cols, rows, spec.projected_shape, dense)}
        if module.bias is not None and module.bias.requires_grad:
            sites[module.bias] = DenseSite(g.reshape(x.shape[0], -1, g.shape[-1]).sum(1))
        return sites


__all__ = ["ProjectedHookEngine", "ProjectionSpec", "Projector", "RandomProjections", "projectable_weights"]
