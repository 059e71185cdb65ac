"""A one-time check of an engine's per-sample gradients against per-example backward passes, on the first batch.

Module hooks assume what they cannot see: that a parameter is used inside its module's call only, that a layer's
input is sample-major, that a module's forward is its type's. Rather than enumerate what breaks these (time-major
tensors flattened with reshape(-1, d), torch.cat of samples through a shared layer, tied output layers, T == B),
each engine compares a few samples of the real first batch with autograd's own d loss_i / d theta once, and refuses
on a mismatch. The reference backpropagates loss_i through the batch's own graph: the same dropout masks and the same
layout as the step, so a mismatch is the engine's, never the randomness'.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_map

from dpbench.tasks import Batch


def checked_samples(batch_size: int) -> list[int]:
    """First, middle and last: spread out, so that a mix-up of samples (a layout the hooks misread) shows."""
    return sorted({0, batch_size // 2, batch_size - 1})


def select(batch: Batch, samples: list[int]) -> Batch:
    inputs, targets = batch
    index = torch.tensor(samples, device=targets.device)
    return tree_map(lambda t: t.index_select(0, index.to(t.device)), inputs), targets.index_select(0, index)


def per_example_gradients(losses: Tensor, params: dict[str, nn.Parameter], samples: list[int]) -> Iterator[dict]:
    """d losses[i] / d params for each sample i in turn, through the graph of `losses` (freed after the last)."""
    names, tensors = list(params), list(params.values())
    for position, i in enumerate(samples):
        grads = torch.autograd.grad(losses[i], tensors, retain_graph=position < len(samples) - 1, allow_unused=True)
        yield {name: torch.zeros_like(p) if g is None else g for name, p, g in zip(names, tensors, grads, strict=True)}


def parameters_reached(losses: Tensor) -> set[Tensor]:
    """Leaves the backward of `losses` accumulates gradients into: one walk over its autograd graph."""
    reached, seen, stack = set(), set(), [losses.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # AccumulateGrad
        if variable is not None:
            reached.add(variable)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return reached


def tolerance(dtype: torch.dtype) -> float:
    """Relative error allowed between two exact computations in `dtype` (3.5e-3 in float32, 1.5e-7 in float64)."""
    return min(0.05, 10 * torch.finfo(dtype).eps ** 0.5)


def mismatched(got: dict[str, Tensor], norms: dict[str, Tensor], expected: dict[str, Tensor]) -> dict[str, float]:
    """Parameters whose per-sample gradient or norm is not the reference's, with the relative error.

    The error of a parameter is measured against its own reference norm plus 1e-4 of the sample's total, so that
    parameters with (nearly) zero gradient are compared at the precision the clipping sees, in the coarser of the
    two sides' precisions (mixed precision forms the sites in the activations' dtype).
    """
    if not all(bool(torch.isfinite(g).all()) for g in expected.values()):
        return {}  # a non-finite sample is dropped from the step anyway
    total = float(torch.sqrt(sum(g.double().pow(2).sum() for g in expected.values())))
    bad = {}
    for name, reference in expected.items():
        value = got.get(name, torch.zeros_like(reference))
        if value.shape != reference.shape:
            bad[name] = float("inf")
            continue
        scale = float(reference.norm()) + 1e-4 * total
        norm = norms.get(name, value.norm())
        error = max(float((value - reference).norm()), abs(float(norm) - float(reference.norm())))
        if not error <= max(tolerance(reference.dtype), tolerance(value.dtype)) * scale:  # also catches nan
            bad[name] = error / scale if scale else float("inf")
    return bad


def describe(bad: dict[str, float]) -> str:
    return ", ".join(f"{name} (relative error {error:.2g})" for name, error in bad.items())


@contextmanager
def evaluation(model: nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) for a check whose two sides would otherwise draw different masks; modes restored."""
    modes = {module: module.training for module in model.modules()}
    model.eval()
    try:
        yield
    finally:
        for module, training in modes.items():
            module.training = training

