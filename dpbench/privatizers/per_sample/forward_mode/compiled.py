"""JL's graph-free directions (jl.directional_projections) compiled by `torch.compile`, on batches padded to a few
sizes.

Compiled, JL r = 10 steps of the ViT at batch 500 took 1,503 against 1,875 ms; the CNN's took twice as long (one
thread, CPU, 2026-11-27, BENCHMARKS.md), hence opt-in (privatizer.compile). In float64 it gives the eager pass's
projections to rounding. Two things keep it honest:
- Shapes: forward-mode convolution cannot be compiled for a symbolic batch size (torch 2.13: "Cannot call
  storage_offset() on tensor with symbolic sizes/strides"), and a fixed size would recompile at every Poisson batch
  size. So a batch is padded to the next multiple of PADDED_SIZES with copies of its first sample, and the padding's
  rows are dropped from the result: rows are each their own sample's (JL checks that the model mixes no samples), so
  the padding changes no real sample's projections. A run compiles once per padded size it meets.
- Random ops: compiled code draws from its own generator, so dropout would get other masks than in the graph pass
  whose backward is clipped. The caller refuses models that draw random numbers (jl.py).
Max-pooling pools again here (the padded shapes differ from the graph pass's records); it takes the same argmax but
at exact ties, where a tangent could differ only when the tied inputs' tangents differ.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils._pytree import tree_map

from dpbench.core.tasks import Batch, batch_size_of

log = logging.getLogger(__name__)

PADDED_SIZES = 64
"""Batches are padded to a multiple of this many samples: Poisson batches of 500 +- 3 standard deviations meet
three sizes (448, 512, 576), so three compilations, and at most 63 padded samples are computed for nothing."""


def padded_size(size: int) -> int:
    return -(-size // PADDED_SIZES) * PADDED_SIZES


def pad_batch(batch: Batch, size: int) -> Batch:
    """Every tensor of the (sample-major) batch extended to `size` rows by copies of its first row."""
    def pad(t: Tensor) -> Tensor:
        extra = size - t.shape[0]
        return torch.cat([t, t[:1].expand(extra, *t.shape[1:])]) if extra else t

    return tree_map(pad, batch)


Projection = Callable[[dict[str, Tensor], dict[str, Tensor], Batch], Tensor]
"""(params, stacked directions, batch) -> (count, B) projections <grad loss_i, v_j>."""


class CompiledTangents:
    """A projection compiled, called on the batch padded and its result cut back to the batch's samples."""

    def __init__(self, project: Projection):
        self._project: Projection = torch.compile(project, dynamic=False)
        self._sizes: set[int] = set()

    def __call__(self, params: dict[str, Tensor], tangents: dict[str, Tensor], batch: Batch) -> Tensor:
        size = batch_size_of(batch)
        padded = padded_size(size)
        if padded not in self._sizes:
            log.info("compiling JL's tangent pass for batches of %d samples (once per padded size)", padded)
            self._sizes.add(padded)
        return self._project(params, tangents, pad_batch(batch, padded))[:, :size]
