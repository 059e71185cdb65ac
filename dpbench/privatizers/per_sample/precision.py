"""Mixed precision in a private step: the model's forward (and so its backward) at bf16, everything that bounds or
releases a sample's contribution in float32 or wider.

`private_step` runs the strategy with autocast off (`float32_step`); only the model's forward passes re-enter the
autocast the step was called under (`model_forward`). So the per-sample norms, the clipping factors, the projections,
the clipped sums and the noise are formed in float32 by construction, not by every op remembering to cast: an op that
autocast would lower (a Gram matrix's bmm, a projection's matmul) sees autocast off, and the recorded bf16 activations
and output gradients are widened before any site is formed (`widened`). fp16 is refused: its range needs a loss
scale, which would have to be undone per sample before the norm.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from typing import Any

import torch
from torch.utils._pytree import tree_map

from dpbench.core.errors import ConfigurationError

MIXED_PRECISION_DTYPES = (torch.bfloat16,)

_step_autocast: ContextVar[tuple[str, torch.dtype] | None] = ContextVar("dpbench_step_autocast", default=None)


def ambient_autocast(device_type: str) -> torch.dtype | None:
    """The dtype autocast lowers to on `device_type` here, or None when autocast is off."""
    if not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


def check_step_precision(device_type: str, strategy_name: str, supports_mixed_precision: bool,
                         supported: Callable[[], Iterable[str]]) -> torch.dtype | None:
    """The step's autocast dtype, refused where the privatizer or the dtype cannot keep the bound exact
    (`supported`, the privatizers that can, is read only for the refusal: not on every step)."""
    dtype = ambient_autocast(device_type)
    if dtype is None:
        return None
    if dtype not in MIXED_PRECISION_DTYPES:
        raise ConfigurationError(
            f"autocast to {dtype} is not supported in a private step: fp16 needs a loss scale that would have to be "
            "undone per sample before clipping; use bf16 (trainer.precision=bf16-mixed)"
        )
    if not supports_mixed_precision:
        raise unsupported_mixed_precision(strategy_name, tuple(supported()))
    return dtype


def unsupported_mixed_precision(strategy_name: str, supported: tuple[str, ...]) -> ConfigurationError:
    return ConfigurationError(
        f"privatizer={strategy_name} does not support trainer.precision=bf16-mixed yet (it runs with "
        f"{', '.join(supported)}): use trainer.precision=32-true"
    )


@contextmanager
def float32_step(device_type: str, dtype: torch.dtype | None) -> Iterator[None]:
    """Autocast off for the step; `model_forward` inside it re-enters autocast at `dtype` (None: stays off)."""
    token = _step_autocast.set(None if dtype is None else (device_type, dtype))
    try:
        with torch.autocast(device_type, enabled=False) if dtype is not None else nullcontext():
            yield
    finally:
        _step_autocast.reset(token)


def model_forward() -> Any:
    """The context of a model forward inside a private step: the step's autocast, or nothing."""
    state = _step_autocast.get()
    if state is None:
        return nullcontext()
    device_type, dtype = state
    return torch.autocast(device_type, dtype=dtype)


def forward_dtype() -> torch.dtype | None:
    """The dtype the step's model forwards run at (None: the parameters' own): per-example checks of the engine
    compare two bf16 computations at bf16's tolerance."""
    state = _step_autocast.get()
    return None if state is None else state[1]


def widened(tree: Any) -> Any:
    """Floating tensors narrower than float32 (bf16 records of an autocast forward) as float32; others unchanged."""
    def widen(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.element_size() < 4:
            return value.float()
        return value

    return tree_map(widen, tree)
