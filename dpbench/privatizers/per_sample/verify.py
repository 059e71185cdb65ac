"""A check of an engine's per-sample gradients against per-example backward passes, before the first step and during
training (check_schedule.py says when).

Module hooks assume what they cannot see: that a parameter is used inside its module's call only, that a layer's
input is sample-major, that a module's forward is its type's, that no layer mixes the samples of a batch. Rather than
enumerate what breaks these (time-major tensors flattened with reshape(-1, d), torch.cat of samples through a shared
layer, tied output layers, T == B, a hand-written batch norm active in training mode only), each engine compares a
few samples of a real batch with d loss_i / d theta from that sample's own forward and backward pass, and refuses on
a mismatch.

Both sides run in training mode, so layers that behave differently while training are checked as they train, with
every dropout made the identity (dropout masks would differ between a batch and its samples alone): nn.Dropout and
its functional forms, attention dropout included. Nothing a check does reaches the run: the global random state and
the model's buffers are restored afterwards. Memory: the per-example pass hands each parameter's gradient over as
autograd forms it and frees it, so a check holds one parameter's gradient (and the engine's side of it) at a time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from dpbench.core.tasks import Batch, Task
from dpbench.privatizers.per_sample.base import graph_nodes
from dpbench.privatizers.per_sample.precision import forward_dtype, model_forward

DROPOUTS = {
    F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout,
    torch.dropout, torch.alpha_dropout, torch.feature_dropout, torch.feature_alpha_dropout,
}
ATTENTION = F.scaled_dot_product_attention
ATTENTION_DROPOUT_POSITION = 4
"""scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, ...)."""
SHARED_DRAW_SEED = 0


class Deviation(NamedTuple):
    """How far an engine's per-sample gradient of one parameter is from the per-example pass's, for one sample."""

    error: float
    """max(|g_engine - g_reference|, |engine norm - reference norm|)."""
    reference_norm: float
    dtypes: tuple[torch.dtype, ...]


Compare = Callable[[str, nn.Parameter, Tensor | None], Deviation]
"""(parameter name, parameter, its per-example gradient or None where unused) -> the engine's deviation from it."""


class _NoDropout(TorchFunctionMode):
    """Every dropout is the identity (attention dropout p = 0) while the mode is active."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in DROPOUTS:
            return args[0] if args else kwargs["input"]
        if func is ATTENTION:
            if len(args) > ATTENTION_DROPOUT_POSITION:
                args = (*args[:ATTENTION_DROPOUT_POSITION], 0.0, *args[ATTENTION_DROPOUT_POSITION + 1:])
            else:
                kwargs = {**kwargs, "dropout_p": 0.0}
        return func(*args, **kwargs)


class RandomDraws(TorchDispatchMode):
    """The random operations run while it is active (aten ops tagged nondeterministic_seeded): randomness a check did
    not neutralise (stochastic depth, noise layers), under which a batch and its samples alone cannot be compared in
    training mode. Ops are watched rather than generator states: on an H100 the CUDA generator's state moved during a
    check of an OPT that drew nothing (dpbench 2026-11-26, cause not found), which refused every transformer there.

    A draw of one number (LayerDrop's per layer; transformers 5.17's OPT draws it even at layerdrop 0) is the whole
    batch's, not a sample's: it is drawn from a fixed seed, so the batch and each sample alone see the same number and
    can be compared, and it is not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (torch.Tag.nondeterministic_seeded not in func.tags or _argument(func, args, kwargs, "dropout_p") == 0.0
                or _argument(func, args, kwargs, "generator") is not None):
            return func(*args, **kwargs)
        with torch.random.fork_rng(devices=self.devices):
            torch.manual_seed(SHARED_DRAW_SEED)
            out = func(*args, **kwargs)
        if not (isinstance(out, Tensor) and out.dim() == 0):
            self.ops.append(func.name())
        return out

    def drawn(self) -> bool:
        return bool(self.ops)

    def describe(self) -> str:
        """The ops that drew, for the refusal's message: what to look for in the model."""
        return ", ".join(sorted(set(self.ops)))


def _argument(func, args: tuple, kwargs: dict, name: str) -> object:
    """An op's argument by schema name (its default where not passed); None where the op has no such argument.

    dropout_p: fused attention ops are seeded through their dropout only. generator: dpbench's own seeded draws (GRAPE's
    projections, the checks' samples) pass their generator explicitly; a model's randomness uses the global one (and
    a noise layer with a generator of its own still fails the check, as a mismatch)."""
    for position, argument in enumerate(func._schema.arguments):
        if argument.name == name:
            return kwargs.get(name, args[position] if position < len(args) else argument.default_value)
    return None


@contextmanager
def as_trained_without_dropout(model: nn.Module) -> Iterator[RandomDraws]:
    """Training mode as the run has it, dropout off; the global RNG and the model's buffers restored afterwards, so
    a check (at whatever step it falls) changes nothing of the run. Yields what tells whether anything still drew."""
    buffers = [(buffer, buffer._version, buffer.detach().clone()) for buffer in model.buffers()]
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    try:
        with torch.random.fork_rng(devices=devices), _NoDropout(), RandomDraws() as draws:
            yield draws
    finally:
        with torch.no_grad():
            for buffer, version, saved in buffers:
                if buffer._version != version:  # only what the check changed: the step's own guard reads versions
                    buffer.copy_(saved)


@contextmanager
def evaluation(model: nn.Module) -> Iterator[None]:
    """Eval mode, modes restored afterwards: for comparing an engine that is exact by construction (functorch) on a
    model that draws random numbers in training."""
    modes = {module: module.training for module in model.modules()}
    model.eval()
    try:
        yield
    finally:
        for module, training in modes.items():
            module.training = training


def select(batch: Batch, samples: list[int]) -> Batch:
    inputs, targets = batch
    index = torch.tensor(samples, dtype=torch.long, device=targets.device)
    return tree_map(lambda t: t.index_select(0, index.to(t.device)), inputs), targets.index_select(0, index)


def per_example_deviations(
    model: nn.Module, task: Task, batch: Batch, sample: int, params: dict[str, nn.Parameter], compare: Compare,
    copies: int = 1,
) -> dict[str, Deviation]:
    """`compare` applied to each parameter's d loss_i / d theta from sample i's own forward and backward pass.

    `copies` > 1: the pass runs sample i repeated that many times and differentiates the first copy's loss, the same
    gradient computed at the batch's shapes (see HookEngine._sample_mismatch). Each gradient is handed over when
    autograd has accumulated it and dropped at once, so at most one parameter's per-example gradient is alive at a
    time. The parameters' .grad are set aside and restored.
    """
    names = {p: name for name, p in params.items()}
    saved = {p: p.grad for p in params.values()}
    deviations: dict[str, Deviation] = {}

    def on_gradient(param: nn.Parameter) -> None:
        deviations[names[param]] = compare(names[param], param, param.grad)
        param.grad = None

    for param in params.values():
        param.grad = None
    handles = [param.register_post_accumulate_grad_hook(on_gradient) for param in params.values()]
    try:
        with model_forward():
            loss = task.per_sample_loss(model, select(batch, [sample] * copies))[0]
        if loss.requires_grad:
            loss.backward(inputs=list(params.values()))
    finally:
        for handle in handles:
            handle.remove()
        for param, grad in saved.items():
            param.grad = grad
    for name, param in params.items():
        if name not in deviations:
            deviations[name] = compare(name, param, None)
    return deviations


def deviation(got: Tensor, got_norm: float, reference: Tensor) -> Deviation:
    """The engine's per-sample gradient `got` (consumed) and the norm it clips with, against the per-example
    `reference`. A reference that is not finite must be matched by an engine value that is not finite either (the
    step drops that sample); a finite one there means the batch computed something the sample alone does not."""
    lowered = forward_dtype()
    dtypes = (got.dtype, reference.dtype) + ((lowered,) if lowered is not None else ())
    reference_norm = float(reference.norm())
    if not math.isfinite(reference_norm):
        return Deviation(0.0 if not math.isfinite(got_norm) else math.inf, 0.0, dtypes)
    if got.shape != reference.shape:
        return Deviation(math.inf, reference_norm, dtypes)
    difference = float(got.sub_(reference.to(got.dtype)).norm())
    return Deviation(max(difference, abs(got_norm - reference_norm)), reference_norm, dtypes)


def parameters_reached(losses: Tensor) -> set[Tensor]:
    """Leaves the backward of `losses` accumulates gradients into (AccumulateGrad nodes' variables)."""
    return {node.variable for node in graph_nodes(losses) if getattr(node, "variable", None) is not None}


def tolerance(dtype: torch.dtype) -> float:
    """Relative error allowed between two exact computations in `dtype` (3.5e-3 in float32, 1.5e-7 in float64)."""
    return min(0.05, 10 * torch.finfo(dtype).eps ** 0.5)


def mismatched(deviations: dict[str, Deviation]) -> dict[str, float]:
    """Parameters whose per-sample gradient or norm is not the reference's, with the relative error.

    The error of a parameter is measured against its own reference norm plus 1e-4 of the sample's total, so that
    parameters with (nearly) zero gradient are compared at the precision the clipping sees, in the coarser of the two
    sides' precisions and the forward's (bf16 under autocast, see per_sample.precision).
    """
    total = math.sqrt(sum(d.reference_norm ** 2 for d in deviations.values()))
    bad = {}
    for name, d in deviations.items():
        scale = d.reference_norm + 1e-4 * total
        allowed = max(tolerance(dtype) for dtype in d.dtypes) * scale
        if not d.error <= allowed:  # `not <=` also catches nan
            bad[name] = d.error / scale if scale and not math.isnan(d.error) else math.inf  # merge's max drops nan
    return bad


def sample_mismatch(deviations: Callable[[int], dict[str, Deviation]], size: int) -> dict[str, float]:
    """Parameters whose per-sample gradient is not the sample's own, from `deviations(copies)` (the sample's pass
    repeated `copies` times). A sample alone runs other kernels than its batch (cuBLAS and attention pick theirs by
    shape): on an H100, OPT-1.3B's float32 gradients of a sample alone differed from the same sample's in a batch of 4
    by 0.4% everywhere and 2% behind one ReLU, above float32's tolerance (dpbench 2026-11-26). So a mismatch is judged
    again against the sample repeated to the batch's size, which runs the batch's kernels on the sample's own data: a
    model that mixes samples still differs there."""
    bad = mismatched(deviations(1))
    if bad and size > 1:
        bad = mismatched(deviations(size))
    return bad


def merge(bad: dict[str, float], more: dict[str, float]) -> dict[str, float]:
    return {name: max(bad.get(name, 0.0), more.get(name, 0.0)) for name in bad.keys() | more.keys()}


def describe(bad: dict[str, float]) -> str:
    return ", ".join(f"{name} (relative error {error:.2g})" for name, error in sorted(bad.items()))
