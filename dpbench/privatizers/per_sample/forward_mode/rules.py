"""Which layers JL's graph-free jvp passes run by dpbench's own forward-mode rules, and the switch that puts them in.

Each rule is exact (the same formulas as functorch's) and only faster: it gets the r directions' tangents at once,
so what depends on the primal alone is computed once. Convolutions and nn.Linear modules are switched by module;
LayerNorm and GELU by function, through a TorchFunctionMode, so that functional calls (Hugging Face's activations)
take them too. The rules carry no backward: they hold only inside the no-grad passes.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from dpbench.privatizers.per_sample.forward_mode.conv import convolution
from dpbench.privatizers.per_sample.forward_mode.linear import linear
from dpbench.privatizers.per_sample.forward_mode.pointwise import gelu, layer_norm

MODULE_RULES: dict[type[nn.Module], Callable[[nn.Module, Tensor], Tensor]] = {
    nn.Conv1d: convolution, nn.Conv2d: convolution, nn.Conv3d: convolution, nn.Linear: linear,
}
"""Module types (exactly: subclasses may compute otherwise) whose forward takes a rule (not transposed convolutions)."""

FUNCTION_RULES: dict[Callable, Callable] = {F.layer_norm: layer_norm, F.gelu: gelu}
"""Functions (as __torch_function__ sees them) whose calls take a rule. Tried and left out, as they did not win in
a step (one thread, CPU, 2026-11-27): activations whose forward-mode rule reads their output (tanh, ReLU), one fused
pass already, where a rule cost the CNN's JL step 6% (tanh); attention with its weights computed once for all
directions, 66 against 91 ms alone on the ViT's shapes but no faster in the ViT's step (1,590 ms either way)."""


class _FunctionRules(TorchFunctionMode):
    """Calls with gradients enabled keep torch's functions: the rules have no backward."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        rule = FUNCTION_RULES.get(func)
        if rule is None or torch.is_grad_enabled() or not args or not isinstance(args[0], Tensor):
            return func(*args, **(kwargs or {}))
        return rule(*args, **(kwargs or {}))


@contextlib.contextmanager
def _module_rules(model: nn.Module) -> Iterator[None]:
    """Modules whose instance already has its own forward (patched by someone else) keep it."""
    modules = [m for m in model.modules() if type(m) in MODULE_RULES and "forward" not in vars(m)]
    for module in modules:
        module.forward = functools.partial(MODULE_RULES[type(module)], module)
    try:
        yield
    finally:
        for module in modules:
            del module.forward


@contextlib.contextmanager
def tangent_rules(model: nn.Module) -> Iterator[None]:
    """While the block runs, the model's convolutions, linear layers, LayerNorm and GELU take the rules."""
    with _module_rules(model), _FunctionRules():
        yield
