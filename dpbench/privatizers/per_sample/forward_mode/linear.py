"""Linear layers in JL's graph-free jvp passes: one batched product per term, written into the tangent in place.

The forward-mode rule of a linear layer is x dW^T + db + dx W^T. Under vmap over JL's directions, functorch runs
x dW^T as one product with r times the output features, then moves the directions in front with a strided copy,
and adds the input tangent's product and the bias tangent in two more passes over the (r, B, ..., out) result. Here
the rule is one op with its own vmap rule: the bias tangent is the accumulator that a batched product over the
directions (the data shared, stride 0) adds into, and the input tangent's product adds into that in place. On the
ViT's 64-to-128 feature layers (r = 10, 8,500 tokens, one thread) that is 69 against 148 ms. Same arithmetic, so the
projections are exact as before.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpbench.privatizers.per_sample.forward_mode.batching import directions_first


def _formula(x: Tensor, weight: Tensor, dx: Tensor | None, dweight: Tensor | None, dbias: Tensor | None) -> Tensor:
    """x dW^T + db + dx W^T, one direction (terms with no tangent left out)."""
    parts = []
    if dweight is not None:
        parts.append(F.linear(x, dweight, dbias))
    elif dbias is not None:
        parts.append(_fresh(dbias.expand(*x.shape[:-1], weight.shape[0])))
    if dx is not None:
        parts.append(F.linear(dx, weight))
    return functools.reduce(torch.add, parts)


def _fresh(expanded: Tensor) -> Tensor:
    """An expanded tangent as a tensor of its own, in the primal's layout: never the direction's storage (over a
    single row, `contiguous()` would return the direction itself, which the in-place product below then writes)."""
    return expanded.clone(memory_format=torch.contiguous_format)


class _LinearTangents(torch.autograd.Function):
    """The tangent as one op whose vmap rule batches the directions itself."""

    @staticmethod
    def forward(x, weight, dx, dweight, dbias):  # noqa: ANN001, ANN205
        return _formula(x, weight, dx, dweight, dbias)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # noqa: ANN001
        """Only used without gradients (inside JL's no-grad jvp pass)."""

    @staticmethod
    def vmap(info, in_dims, x, weight, dx, dweight, dbias):  # noqa: ANN001, ANN205
        if in_dims[0] is not None or in_dims[1] is not None:  # the primal batched, not JL's shape: functorch's rules
            return torch.vmap(_formula, in_dims=in_dims)(x, weight, dx, dweight, dbias), 0
        count, (out, features) = info.batch_size, weight.shape
        dx, dweight, dbias = (directions_first(t, d, count)
                              for t, d in zip((dx, dweight, dbias), in_dims[2:], strict=True))
        rows = x.reshape(-1, features)
        if dweight is not None:  # the data shared by the directions (stride 0), the bias tangent as accumulator
            shared, by_weight = rows.expand(count, *rows.shape), dweight.transpose(1, 2)
            total = torch.bmm(shared, by_weight) if dbias is None else torch.baddbmm(dbias.unsqueeze(1), shared,
                                                                                      by_weight)
        elif dbias is not None:
            total = _fresh(dbias.unsqueeze(1).expand(count, rows.shape[0], out))
        if dx is not None:
            by_input = dx.reshape(-1, features)
            if dweight is None and dbias is None:
                total = (by_input @ weight.T).view(count, -1, out)
            else:
                total.view(-1, out).addmm_(by_input, weight.T)
        return total.view(count, *x.shape[:-1], out), 0


class _LinearJvp(torch.autograd.Function):
    """The module's linear map, with `_LinearTangents` as its forward-mode rule."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, weight, bias):  # noqa: ANN001, ANN205
        return F.linear(x, weight, bias)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # noqa: ANN001
        x, weight, _ = inputs
        ctx.set_materialize_grads(False)  # data carries no tangent: None, not a zero tensor to multiply
        ctx.save_for_forward(x, weight)

    @staticmethod
    def jvp(ctx, dx, dweight, dbias):  # noqa: ANN001, ANN205
        x, weight = ctx.saved_tensors
        if dx is None and dweight is None and dbias is None:
            return None
        return _LinearTangents.apply(x, weight, dx, dweight, dbias)


def linear(module: nn.Linear, x: Tensor) -> Tensor:
    """The module's forward with the rule above (rules.py switches it in)."""
    return _LinearJvp.apply(x, module.weight, module.bias)
