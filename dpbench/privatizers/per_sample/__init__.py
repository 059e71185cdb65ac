"""Per-sample gradient engines, chosen by what the model is made of."""

from __future__ import annotations

from torch import nn

from dpbench.core.errors import ConfigurationError, UnsupportedModelError
from dpbench.privatizers.per_sample.auto import AutoEngine
from dpbench.privatizers.per_sample.base import ClippedSum, refuse_sample_mixing_layers, trainable_parameters
from dpbench.privatizers.per_sample.check_schedule import CheckSchedule
from dpbench.privatizers.per_sample.functorch import FunctorchEngine
from dpbench.privatizers.per_sample.hooks import HookEngine, MaterializedEngine, PerSampleMismatch, check_hook_engine

PerSampleEngine = HookEngine | AutoEngine

ENGINES = ("auto", "hooks", "functorch", "materialized")


def check_engine(model: nn.Module, engine: str) -> None:
    """What make_engine would refuse of this model and engine name, without hooking anything: auto and functorch
    serve any model (vmap), the hooks only one proven per-sample."""
    if engine not in ENGINES:
        raise ConfigurationError(f"privatizer.engine must be one of {ENGINES}, got {engine!r}")
    refuse_sample_mixing_layers(model)
    if engine in ("hooks", "materialized"):
        check_hook_engine(model)


def engine_state_bytes(model: nn.Module, engine: str, chunk_size: int | None, micro_batch: int,
                       activation_bytes: int) -> int:
    """What an engine holds beside the model's activations: the hooks' records of every layer's input and output
    gradient (about the activations again: measured, BENCHMARKS.md issue 49), and for materialized and functorch the
    micro-batch's (or a vmap chunk's) per-sample gradients too; auto takes the hooks where they serve the model."""
    if engine in ("auto", "hooks"):
        try:
            check_hook_engine(model)
            return activation_bytes
        except UnsupportedModelError:
            pass
    samples = micro_batch if engine == "materialized" or chunk_size is None else min(chunk_size, micro_batch)
    return activation_bytes + samples * sum(p.numel() * p.element_size() for p in trainable_parameters(model).values())


def make_engine(
    model: nn.Module, engine: str = "auto", chunk_size: int | None = None, checks: CheckSchedule | None = None
) -> PerSampleEngine:
    """auto: hooks (fastest, see BENCHMARKS.md) for a model proven per-sample (construction.py) while they serve it,
    else functorch; hooks: refuse what they cannot serve; functorch: vmap; materialized: the hooks with every
    per-sample gradient built in full (the papers' DP-SGD baseline). Every engine checks its first batch against
    per-example backward passes, and the hooks check again during training at the steps `checks` (the strategy's,
    which knows the step) draws."""
    if engine not in ENGINES:
        raise ConfigurationError(f"privatizer.engine must be one of {ENGINES}, got {engine!r}")
    refuse_sample_mixing_layers(model)
    if engine == "hooks":
        return HookEngine(model, checks)
    if engine == "materialized":
        return MaterializedEngine(model, checks)
    return AutoEngine(model, chunk_size=chunk_size, hooks=engine == "auto", checks=checks)


__all__ = [
    "AutoEngine",
    "CheckSchedule",
    "ClippedSum",
    "FunctorchEngine",
    "HookEngine",
    "MaterializedEngine",
    "PerSampleEngine",
    "PerSampleMismatch",
    "check_engine",
    "engine_state_bytes",
    "check_hook_engine",
    "make_engine",
    "refuse_sample_mixing_layers",
    "trainable_parameters",
]
