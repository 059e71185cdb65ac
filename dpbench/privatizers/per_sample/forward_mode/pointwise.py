"""LayerNorm and GELU in JL's graph-free jvp passes: what depends only on the primal is computed once.

The r directions share the primal, so the normalised input and the inverse deviation of a LayerNorm, and GELU's
derivative, are the same for all of them; functorch's rules evaluate them again for every direction and
spend several passes over the (r, B, ..., features) tangent on each (a LayerNorm took 46 ms for r = 10 on 8,500
tokens of 64 features, one thread; this rule 16 ms; GELU 14.5 against 4.4 ms). Here each op is an autograd Function
whose vmap rule receives the directions' physical tangents: the primal's statistics once, then a few in-place
passes. Same formulas, so the projections stay exact (float64 checks in tests/per_sample/test_jl_tangent_rules.py).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from dpbench.privatizers.per_sample.forward_mode.batching import directions_first


def _normalised(x: Tensor, size: int, eps: float) -> tuple[Tensor, Tensor]:
    """x's rows over the last `size` elements: (x - mean) / deviation and 1 / deviation, as (rows, size), (rows, 1)."""
    rows = x.reshape(-1, size)
    var, mean = torch.var_mean(rows, -1, correction=0, keepdim=True)
    inverse = (var + eps).rsqrt()
    return (rows - mean) * inverse, inverse


def _layer_norm_tangent(normalised: Tensor, inverse: Tensor, weight: Tensor | None, dx: Tensor | None,
                        dweight: Tensor | None, dbias: Tensor | None) -> Tensor:
    """Tangents of rows-shaped LayerNorm outputs, (count, rows, size) tangents in, directions first:
    inverse * (dx - mean(dx) - x^ mean(x^ dx)) * weight + x^ dweight + dbias."""
    total = None
    if dx is not None:
        projection = torch.linalg.vecdot(dx, normalised).div_(normalised.shape[-1]).unsqueeze(-1)
        total = dx - dx.mean(-1, keepdim=True)
        total.addcmul_(normalised, projection, value=-1)
        total.mul_(inverse if weight is None else inverse * weight.reshape(-1))
    if dweight is not None:
        dweight = dweight.flatten(1).unsqueeze(1)
        total = normalised * dweight if total is None else total.addcmul_(normalised, dweight)
    if dbias is not None:
        by_bias = dbias.flatten(1).unsqueeze(1)
        total = by_bias.expand(by_bias.shape[0], *normalised.shape).clone() if total is None else total.add_(by_bias)
    return total


def _layer_norm_formula(x: Tensor, weight: Tensor | None, dx: Tensor | None, dweight: Tensor | None,
                        dbias: Tensor | None, shape: tuple[int, ...], eps: float) -> Tensor:
    """The same tangent for one direction, out of place (so that functorch can also batch it over the primal)."""
    dims = tuple(range(-len(shape), 0))
    var, mean = torch.var_mean(x, dims, correction=0, keepdim=True)
    inverse = (var + eps).rsqrt()
    normalised = (x - mean) * inverse
    parts = []
    if dx is not None:
        centred = dx - dx.mean(dims, keepdim=True) - normalised * (dx * normalised).mean(dims, keepdim=True)
        parts.append(centred * inverse if weight is None else centred * inverse * weight)
    if dweight is not None:
        parts.append(normalised * dweight)
    if dbias is not None:
        parts.append(torch.zeros_like(x) + dbias)
    return functools.reduce(torch.add, parts)


class _LayerNormTangents(torch.autograd.Function):
    """The tangent as one op whose vmap rule takes the directions at once."""

    @staticmethod
    def forward(x, weight, dx, dweight, dbias, shape, eps):  # noqa: ANN001, ANN205
        return _layer_norm_formula(x, weight, dx, dweight, dbias, shape, eps)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # noqa: ANN001
        """Only used without gradients (inside JL's no-grad jvp pass)."""

    @staticmethod
    def vmap(info, in_dims, x, weight, dx, dweight, dbias, shape, eps):  # noqa: ANN001, ANN205
        if in_dims[0] is not None or in_dims[1] is not None:  # the primal batched, not JL's shape: functorch batches
            return torch.vmap(functools.partial(_layer_norm_formula, shape=shape, eps=eps),
                              in_dims=in_dims[:5])(x, weight, dx, dweight, dbias), 0
        count, size = info.batch_size, math.prod(shape)
        normalised, inverse = _normalised(x, size, eps)
        dx, dweight, dbias = (directions_first(t, d, count)
                              for t, d in zip((dx, dweight, dbias), in_dims[2:5], strict=True))
        dx = None if dx is None else dx.reshape(count, -1, size)
        total = _layer_norm_tangent(normalised, inverse, weight, dx, dweight, dbias)
        return total.view(count, *x.shape), 0


class _LayerNormJvp(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x, shape, weight, bias, eps):  # noqa: ANN001, ANN205
        return F.layer_norm(x, shape, weight, bias, eps)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # noqa: ANN001
        x, ctx.shape, weight, _, ctx.eps = inputs
        ctx.set_materialize_grads(False)
        ctx.save_for_forward(x, weight)

    @staticmethod
    def jvp(ctx, dx, _, dweight, dbias, __):  # noqa: ANN001, ANN205
        x, weight = ctx.saved_tensors
        if dx is None and dweight is None and dbias is None:
            return None
        return _LayerNormTangents.apply(x, weight, dx, dweight, dbias, tuple(ctx.shape), ctx.eps)


def _gelu_derivative(x: Tensor, approximate: str) -> Tensor:
    return torch.ops.aten.gelu_backward(torch.ones_like(x), x, approximate=approximate)


class _GeluTangents(torch.autograd.Function):
    """dx * gelu'(x), with gelu'(x) computed once for all directions."""

    @staticmethod
    def forward(x, dx, approximate):  # noqa: ANN001, ANN205
        return torch.ops.aten.gelu_backward(dx, x, approximate=approximate)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # noqa: ANN001
        """Only used without gradients (inside JL's no-grad jvp pass)."""

    @staticmethod
    def vmap(info, in_dims, x, dx, approximate):  # noqa: ANN001, ANN205
        if in_dims[0] is not None:  # the primal batched, not JL's shape: functorch batches the formula
            return torch.vmap(lambda a, b: torch.ops.aten.gelu_backward(b, a, approximate=approximate),
                              in_dims=in_dims[:2])(x, dx), 0
        return directions_first(dx, in_dims[1], info.batch_size) * _gelu_derivative(x, approximate), 0


class _GeluJvp(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x, approximate):  # noqa: ANN001, ANN205
        return F.gelu(x, approximate=approximate)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # noqa: ANN001
        x, ctx.approximate = inputs
        ctx.set_materialize_grads(False)
        ctx.save_for_forward(x)

    @staticmethod
    def jvp(ctx, dx, _):  # noqa: ANN001, ANN205
        (x,) = ctx.saved_tensors
        return None if dx is None else _GeluTangents.apply(x, dx, ctx.approximate)


def layer_norm(x: Tensor, normalized_shape: Sequence[int], weight: Tensor | None = None,
                bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    return _LayerNormJvp.apply(x, tuple(normalized_shape), weight, bias, eps)


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    return _GeluJvp.apply(x, approximate)
