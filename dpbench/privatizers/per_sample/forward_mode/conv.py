"""Convolutions in JL's graph-free jvp passes: the r directions' weight tangents as one convolution.

The forward-mode rule of a convolution is conv(x, dW, db) + conv(dx, W). Under vmap over JL's directions, functorch
runs conv(x, dW) as one convolution with r times the output channels, but adds the bias tangent in a separate pass
over the whole (r, B, out, ...) result, and where x carries no tangent (the first layer, whose input is data) it
also convolves and adds a zero input tangent: on the TF-Privacy CNN (batch 256, r = 10) those passes over the first
layer's 8M-element tangent took a fifth of a JL step. Here the rule is one op with its own vmap rule, which gets the
physical tangents: the bias goes into the stacked convolution, an absent input tangent is skipped, and the input
tangent's convolution adds into the result in place. Same arithmetic, so the projections are exact as before.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from dpbench.privatizers.per_sample.forward_mode.batching import directions_first


def _formula(x: Tensor, weight: Tensor, dx: Tensor | None, dweight: Tensor | None, dbias: Tensor | None,
             module: nn.Module) -> Tensor:
    """conv(x, dW, db) + conv(dx, W), one direction (terms with no tangent left out)."""
    parts = []
    if dweight is not None:
        parts.append(module._conv_forward(x, dweight, dbias))
    if dx is not None:
        parts.append(module._conv_forward(dx, weight, None))
    return functools.reduce(torch.add, parts)


class _ConvTangents(torch.autograd.Function):
    """The tangent as one op whose vmap rule stacks the directions itself."""

    @staticmethod
    def forward(x, weight, dx, dweight, dbias, module):  # noqa: ANN001, ANN205
        return _formula(x, weight, dx, dweight, dbias, module)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # noqa: ANN001
        """Only used without gradients (inside JL's no-grad jvp pass)."""

    @staticmethod
    def vmap(info, in_dims, x, weight, dx, dweight, dbias, module):  # noqa: ANN001, ANN205
        x_dim, weight_dim, dx_dim, dweight_dim, dbias_dim, _ = in_dims
        unbatched = x.dim() < weight.dim()  # one sample without its batch dimension: stacking would read channels
        if x_dim is not None or weight_dim is not None or dweight_dim is None or module.groups != 1 or unbatched:
            # not JL's shape (primal batched or unbatched, grouped channels that stacking would mix): functorch's rules
            return torch.vmap(functools.partial(_formula, module=module), in_dims=in_dims[:5])(
                x, weight, dx, dweight, dbias), 0
        count, out = info.batch_size, weight.shape[0]
        stacked_weight = directions_first(dweight, dweight_dim, count).reshape(count * out, *weight.shape[1:])
        dbias = directions_first(dbias, dbias_dim, count)
        stacked_bias = None if dbias is None else dbias.reshape(count * out)
        by_weight = module._conv_forward(x, stacked_weight, stacked_bias)  # (B, count * out, ...)
        by_weight = by_weight.view(x.shape[0], count, out, *by_weight.shape[2:])
        if dx is None:  # directions first, so each direction's tangent has the primal's strides, as forward AD needs
            return by_weight.transpose(0, 1).contiguous(), 0
        dx = directions_first(dx, dx_dim, count)
        total = module._conv_forward(dx.reshape(count * dx.shape[1], *dx.shape[2:]), weight, None)
        total = total.view(count, x.shape[0], *total.shape[1:])
        return total.add_(by_weight.transpose(0, 1)), 0


class _ConvJvp(torch.autograd.Function):
    """The module's convolution, with `_ConvTangents` as its forward-mode rule."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, weight, bias, module):  # noqa: ANN001, ANN205
        return module._conv_forward(x, weight, bias)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # noqa: ANN001
        x, weight, _, module = inputs
        ctx.module = module
        ctx.set_materialize_grads(False)  # data carries no tangent: None, not a zero tensor to convolve
        ctx.save_for_forward(x, weight)

    @staticmethod
    def jvp(ctx, dx, dweight, dbias, _):  # noqa: ANN001, ANN205
        x, weight = ctx.saved_tensors
        if dx is None and dweight is None and dbias is None:
            return None
        if dweight is None and dbias is not None:  # a frozen weight under a trainable bias
            dweight = torch.zeros_like(weight)
        return _ConvTangents.apply(x, weight, dx, dweight, dbias, ctx.module)


def convolution(module: nn.Module, x: Tensor) -> Tensor:
    """The module's forward with the rule above (rules.py switches it in)."""
    return _ConvJvp.apply(x, module.weight, module.bias, module)
