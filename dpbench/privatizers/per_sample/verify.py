"""A one-time check of an engine's per-sample gradients against per-example backward passes, on the first batch.

Module hooks assume what they cannot see: that a parameter is used inside its module's call only, that a layer's
input is sample-major, that a module's forward is its type's. Rather than enumerate what breaks these (time-major
tensors flattened with reshape(-1, d), torch.cat of samples through a shared layer, tied output layers, T == B),
each engine compares a few samples of the real first batch with d loss_i / d theta from that sample's own forward and
backward pass once, and refuses on a mismatch. Both sides run in eval mode, so dropout masks cannot differ; the engine
side runs on the real batch, so its shapes (T == B) are the step's. Only summaries of the gradients are kept.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_map

from dpbench.privatizers.per_sample.base import graph_nodes
from dpbench.tasks import Batch, Task

DIRECTIONS = 2


class Summary(NamedTuple):
    """A per-sample gradient of one parameter, as far as a check needs it."""

    shape: torch.Size
    dtype: torch.dtype
    values: Tensor
    """float64 (norm, <g, r_1>, ..., <g, r_DIRECTIONS>)."""


def checked_samples(batch_size: int) -> list[int]:
    """First, middle and last: spread out, so that a mix-up of samples (a layout the hooks misread) shows."""
    return sorted({0, batch_size // 2, batch_size - 1})


def select(batch: Batch, samples: list[int]) -> Batch:
    inputs, targets = batch
    index = torch.tensor(samples, device=targets.device)
    return tree_map(lambda t: t.index_select(0, index.to(t.device)), inputs), targets.index_select(0, index)


def per_example_gradients(
    model: nn.Module, task: Task, batch: Batch, params: dict[str, nn.Parameter], samples: list[int]
) -> Iterator[dict[str, Tensor]]:
    """d loss_i / d params for each sample i in turn, from a forward and backward of that sample alone."""
    names, tensors = list(params), list(params.values())
    for i in samples:
        loss = task.per_sample_loss(model, select(batch, [i]))[0]
        grads = torch.autograd.grad(loss, tensors, allow_unused=True)
        yield {name: torch.zeros_like(p) if g is None else g for name, p, g in zip(names, tensors, grads, strict=True)}


def summarize(gradients: dict[str, Tensor]) -> dict[str, Summary]:
    """Per parameter: its norm and <g, r_k> for fixed Gaussian directions r_k.

    Two numbers that move with any change of the vector stand in for it, so a check holds no parameter-sized copies
    (the first step's peak memory stays a step's). The directions are public, seeded by the parameter's position.
    """
    summaries = {}
    for index, (name, g) in enumerate(gradients.items()):
        generator = torch.Generator(device=g.device).manual_seed(index)
        values = [g.norm()] + [
            (g * torch.randn(g.shape, generator=generator, dtype=g.dtype, device=g.device)).sum()
            for _ in range(DIRECTIONS)
        ]
        summaries[name] = Summary(g.shape, g.dtype, torch.stack(values).double().cpu())
    return summaries


def parameters_reached(losses: Tensor) -> set[Tensor]:
    """Leaves the backward of `losses` accumulates gradients into (AccumulateGrad nodes' variables)."""
    return {node.variable for node in graph_nodes(losses) if getattr(node, "variable", None) is not None}


def tolerance(dtype: torch.dtype) -> float:
    """Relative error allowed between two exact computations in `dtype` (3.5e-3 in float32, 1.5e-7 in float64)."""
    return min(0.05, 10 * torch.finfo(dtype).eps ** 0.5)


def mismatched(got: dict[str, Summary], norms: dict[str, float], expected: dict[str, Summary]) -> dict[str, float]:
    """Parameters whose per-sample gradient (summarized) or norm is not the reference's, with the relative error.

    The error of a parameter is measured against its own reference norm plus 1e-4 of the sample's total, so that
    parameters with (nearly) zero gradient are compared at the precision the clipping sees, in the coarser of the
    two sides' precisions (mixed precision forms the sites in the activations' dtype). A projection of an error e on
    a random direction is of the order of |e|, up to a few times: hence the slack of 4.
    """
    if not all(bool(torch.isfinite(summary.values).all()) for summary in expected.values()):
        return {}  # a non-finite sample is dropped from the step anyway
    total = float(sum(summary.values[0] ** 2 for summary in expected.values())) ** 0.5
    bad = {}
    for name, reference in expected.items():
        value = got[name]
        ref_norm = float(reference.values[0])
        scale = ref_norm + 1e-4 * total
        norm_error = max(abs(float(value.values[0]) - ref_norm), abs(norms.get(name, ref_norm) - ref_norm))
        error = max(norm_error, float((value.values[1:] - reference.values[1:]).abs().max()) / 4)
        allowed = max(tolerance(reference.dtype), tolerance(value.dtype)) * scale
        if value.shape != reference.shape or not error <= allowed:  # `not <=` also catches nan
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

