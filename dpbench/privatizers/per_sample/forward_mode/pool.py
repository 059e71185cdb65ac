"""Max-pooling in JL's graph-free jvp passes by the graph pass's argmax, a gather instead of a pooling.

Every jvp pass recomputes the primal, and on CPU `max_pool2d_with_indices` is slow for small strides (2x2/1 on the
TF-Privacy CNN: 5.8 ms a call at batch 256, a third of a JL step). Its forward-mode rule only gathers the input's
tangent at the argmax, and the argmax is the graph pass's: the same parameters, input and replayed random ops give
the same primal. So the graph pass records each max-pooling call's indices, and the later passes gather both primal
and tangent there: the primal values are the maxima themselves and the tangent is exactly what max-pooling's rule
gives. At a tie it is also the argmax that the step's backward routes the gradient through, so every projection is
of the gradient that gets clipped. A call whose input shape differs from its record (a module called more often, or
differently) pools as usual.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch.nn.functional as F
from torch import Tensor, nn

POOLS = {nn.MaxPool1d: (F.max_pool1d, 1), nn.MaxPool2d: (F.max_pool2d, 2), nn.MaxPool3d: (F.max_pool3d, 3)}
"""Max-pooling modules, their functional form and how many trailing dimensions they pool over."""

Records = dict[nn.Module, list[tuple[tuple[int, ...], Tensor]]]


def _pools(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if type(m) in POOLS and not m.return_indices and "forward" not in vars(m)]


def _pool(module: nn.Module, x: Tensor, with_indices: bool) -> Tensor | tuple[Tensor, Tensor]:
    function, _ = POOLS[type(module)]
    return function(x, module.kernel_size, module.stride, module.padding, module.dilation, module.ceil_mode,
                    return_indices=with_indices)


def _recording_forward(module: nn.Module, records: Records, x: Tensor) -> Tensor:
    output, indices = _pool(module, x, with_indices=True)
    records[module].append((tuple(x.shape), indices.detach()))
    return output


def _gathering_forward(module: nn.Module, calls: Iterator[tuple[tuple[int, ...], Tensor]], x: Tensor) -> Tensor:
    shape, indices = next(calls, ((), None))
    if indices is None or tuple(x.shape) != shape:
        return _pool(module, x, with_indices=False)
    dims = POOLS[type(module)][1]
    return x.flatten(-dims).gather(-1, indices.flatten(-dims)).view(indices.shape)


@contextlib.contextmanager
def recording_pools(model: nn.Module) -> Iterator[Records]:
    """Record every max-pooling call's input shape and argmax while the block runs (the graph pass)."""
    records: Records = {module: [] for module in _pools(model)}
    for module in records:
        module.forward = functools.partial(_recording_forward, module, records)
    try:
        yield records
    finally:
        for module in records:
            del module.forward


class GatheringPools:
    """Max-pooling by the recorded argmax, each pass (a call of the model) reading the records from the first."""

    def __init__(self, records: Records):
        self.records = {module: calls for module, calls in records.items() if calls}
        self.cursors: dict[nn.Module, Iterator[tuple[tuple[int, ...], Tensor]]] = {}
        self.rewind()

    def rewind(self) -> None:
        self.cursors = {module: iter(calls) for module, calls in self.records.items()}

    def forward(self, module: nn.Module, x: Tensor) -> Tensor:
        return _gathering_forward(module, self.cursors[module], x)


@contextlib.contextmanager
def gathering_pools(records: Records) -> Iterator[GatheringPools]:
    """While the block runs, max-pooling modules with records gather at them; call `rewind()` before each pass."""
    pools = GatheringPools(records)
    for module in pools.records:
        module.forward = functools.partial(pools.forward, module)
    try:
        yield pools
    finally:
        for module in pools.records:
            del module.forward
