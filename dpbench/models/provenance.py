"""Which model objects dpbench's own code built: the batch-level per-sample engines may serve them (see
dpbench.privatizers.per_sample.construction) while their modules stay those they were built with. The record is an
attribute of the model, so that a copy (copy.deepcopy, a DDP replica) keeps it and a rebuilt module loses it."""

from __future__ import annotations

from torch import nn
from torch.distributed.fsdp import FSDPModule

ATTRIBUTE = "_dpbench_built_structure"


def unwrapped_type(module: nn.Module) -> type:
    """The module's class, under FSDP2's `fully_shard` (which swaps in a subclass FSDP<Class> whose only addition is
    gathering the parameters around the class's own forward) the class it wrapped."""
    cls = type(module)
    if isinstance(module, FSDPModule):
        return next(base for base in cls.__bases__ if base is not FSDPModule)
    return cls


def structure(model: nn.Module) -> tuple:
    """What a builder's proof rests on: every submodule's name, exact type and that type's forward (a class patched
    after building is another model; one sharded by FSDP2 is the same model)."""
    return tuple((name, unwrapped_type(module), unwrapped_type(module).forward)
                 for name, module in model.named_modules())


def built_by_dpbench(model: nn.Module) -> nn.Module:
    """Record that dpbench's own code built `model` (its builders, and tests of the engines' rules)."""
    object.__setattr__(model, ATTRIBUTE, structure(model))
    return model


def built_structure(model: nn.Module) -> tuple | None:
    """The structure `model` had when dpbench built it; None when dpbench did not build it."""
    return vars(model).get(ATTRIBUTE)
