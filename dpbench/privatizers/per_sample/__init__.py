"""Per-sample gradient engines, chosen by what the model is made of."""

from __future__ import annotations

from torch import nn

from dpbench.errors import ConfigurationError
from dpbench.privatizers.per_sample.base import ClippedSum, refuse_sample_mixing_layers, trainable_parameters
from dpbench.privatizers.per_sample.functorch import FunctorchEngine
from dpbench.privatizers.per_sample.hooks import HookEngine, unsupported_modules

PerSampleEngine = HookEngine | FunctorchEngine

ENGINES = ("auto", "hooks", "functorch")


def make_engine(model: nn.Module, engine: str = "auto", chunk_size: int | None = None) -> PerSampleEngine:
    """hooks (fastest, see BENCHMARKS.md) when every trainable layer has a rule, else functorch."""
    if engine not in ENGINES:
        raise ConfigurationError(f"privatizer.engine must be one of {ENGINES}, got {engine!r}")
    refuse_sample_mixing_layers(model)
    if engine == "hooks" or (engine == "auto" and not unsupported_modules(model)):
        return HookEngine(model)
    return FunctorchEngine(model, chunk_size=chunk_size)


__all__ = [
    "ClippedSum",
    "FunctorchEngine",
    "HookEngine",
    "PerSampleEngine",
    "make_engine",
    "refuse_sample_mixing_layers",
    "trainable_parameters",
]
