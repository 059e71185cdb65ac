"""Which models the batch-level engines may serve: those proven per-sample before training, and still the same model
at every step.

The hook engine, JL, GRAPE, D2P2's hooks and sparse run one forward over the whole batch and trust that sample i's
loss depends on sample i alone. Checks that compare a few samples at a few steps make a leak unlikely, never
impossible: a forward may start mixing samples after step 0 (a flag the user's loop sets, a branch taken only on a
rare input, a test of the batch's size). So these engines serve only a model whose every forward is code dpbench
knows to be per-sample:

- a model a dpbench builder made (`model=cnn`, `vit`, ...: its forward is dpbench's own code, or a Hugging Face
  architecture dpbench tests), whose modules are still those it was built with; or
- a container of such models and of torch.nn layers whose forward treats each sample alone (`nn.Sequential` of
  `nn.Linear`, `nn.Conv2d`, `nn.LayerNorm`, `nn.ReLU`, ...), exactly those types;

with no hook of the user's on any module, and a task of dpbench's. The proof is structural (types, no instance
forwards, no hooks), so it is re-made before every step in O(modules): a model changed after step 0 is caught before
the step that would use it. Every other model runs on torch.func.vmap (privatizer.engine=auto, functorch), where each
sample's forward sees no batch dimension, so batch statistics, size tests and cross-sample attention are per-sample by
construction; the strategies that have no such engine refuse it, naming the module and the fix.
"""

from __future__ import annotations

import torch
from torch import nn

from dpbench.core.errors import UnsupportedModelError
from dpbench.models.provenance import built_structure, structure, unwrapped_type

PER_SAMPLE_LAYERS: tuple[type[nn.Module], ...] = (
    nn.Sequential, nn.Linear, nn.Bilinear, nn.Conv1d, nn.Conv2d, nn.Embedding, nn.LayerNorm, nn.GroupNorm,
    nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d,
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Mish, nn.Tanh, nn.Sigmoid, nn.Softplus,
    nn.Hardtanh, nn.Hardswish, nn.Hardsigmoid,
    nn.MaxPool1d, nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d,
    nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.Flatten, nn.Unflatten, nn.Softmax, nn.LogSoftmax,
)
"""torch.nn types whose forward treats the first dimension as samples and never mixes them (given a batched input;
the conditions in `_layer_refusal` rule out the arguments that would make one mix the batch dimension)."""
_FORWARDS = {layer: layer.forward for layer in PER_SAMPLE_LAYERS}
"""Their forwards as torch defines them: a class patched later is not the layer proven here."""

PROVEN = "a model proven per-sample before training, re-proven before every step"
VMAP = "torch.func.vmap: each sample's forward sees no batch dimension (per-sample by construction)"
FIX = ("privatizer.engine=functorch (or auto) runs any model under torch.func.vmap, per-sample by construction "
       "(privatizer=vanilla or d2p2); the other privatizers need a model dpbench has proven per-sample")

KNOWN_HOOK_MODULES = ("dpbench.", "torch.distributed.fsdp._fully_shard.")
"""Whose module hooks are known not to touch the samples: dpbench's engines' recording hooks, and FSDP2's, which
gather a sharded module's parameters before its forward and free them after."""


def _foreign_hooks(hooks: dict) -> bool:
    """Hooks of neither dpbench nor FSDP2 (KNOWN_HOOK_MODULES)."""
    for hook in hooks.values():
        function = getattr(hook, "func", hook)  # functools.partial
        if not getattr(function, "__module__", "").startswith(KNOWN_HOOK_MODULES):
            return True
    return False


def _hook_refusal(name: str, module: nn.Module) -> str | None:
    for kind in ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks"):
        if _foreign_hooks(getattr(module, kind, {})):
            return f"{name} ({type(module).__name__}) has a {kind.strip('_').replace('_', ' ')[:-1]} of its own"
    own = vars(module)
    if "forward" in own and not getattr(own["forward"], "__module__", "").startswith("dpbench."):
        return f"{name} ({type(module).__name__}) has its forward replaced on the instance"
    if own.get("_compiled_call_impl") is not None or "_call_impl" in own:
        return f"{name} ({type(module).__name__}) is called through a compiled or replaced call (module.compile())"
    return None


def _layer_refusal(name: str, module: nn.Module) -> str | None:
    """Why a torch.nn layer of PER_SAMPLE_LAYERS's types would still mix samples with these arguments (None: it
    does not)."""
    if isinstance(module, nn.Flatten) and module.start_dim < 1:  # a negative one is the batch's on some rank
        return f"{name} (Flatten) may flatten from the batch dimension (start_dim={module.start_dim})"
    if isinstance(module, nn.Unflatten) and module.dim < 1:
        return f"{name} (Unflatten) may split the batch dimension (dim={module.dim})"
    if isinstance(module, (nn.Softmax, nn.LogSoftmax)) and (module.dim is None or module.dim < 1 and module.dim != -1):
        return f"{name} ({type(module).__name__}) may normalise over the batch dimension (dim={module.dim})"
    return None


def _module_refusal(name: str, module: nn.Module) -> str | None:
    """Why `module`'s code is not proven per-sample (None: it is); its hooks are fast_path_refusal's."""
    built = built_structure(module)
    if built is not None:
        if built != structure(module):
            return f"{name} ({type(module).__name__}) has other modules than dpbench built it with"
        return None
    cls = unwrapped_type(module)
    if cls not in PER_SAMPLE_LAYERS:
        return (f"{name} ({cls.__name__}) has a forward dpbench has not proven per-sample (code of your "
                "own, or a layer outside the per-sample torch.nn layers)")
    if type(module).forward is not _FORWARDS[cls]:
        return f"{name} ({cls.__name__}) has its class's forward patched"
    layer = _layer_refusal(name, module)
    if layer is not None:
        return layer
    for child_name, child in module.named_children():
        refusal = _module_refusal(f"{name}.{child_name}" if name != "<root>" else child_name, child)
        if refusal is not None:
            return refusal
    return None


def _global_hooks() -> bool:
    hooks = torch.nn.modules.module
    return any(_foreign_hooks(getattr(hooks, kind, {})) for kind in (
        "_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_pre_hooks", "_global_backward_hooks"))


def _dpbench_task(task: object) -> bool:
    return type(task).__module__.startswith("dpbench.")


def fast_path_refusal(model: nn.Module, task: object = None) -> str | None:
    """Why the batch-level engines may not serve `model` (and `task`, when given) now; None when they may.
    O(modules): re-made before every step."""
    if task is not None and not _dpbench_task(task):
        return (f"the task {type(task).__name__} is not one of dpbench's, so its loss may mix the samples of a "
                "batch")
    if _global_hooks():
        return "a global module hook is registered (torch.nn.modules.module.register_module_forward_hook ...)"
    for name, module in model.named_modules():  # every submodule's own hooks, also inside proven models
        refusal = _hook_refusal(name or "<root>", module)
        if refusal is not None:
            return refusal
    return _module_refusal("<root>", model)


def require_fast_path(model: nn.Module, who: str, task: object = None) -> None:
    """Refuse a model the batch-level engines may not serve, naming the module and the fix."""
    refusal = fast_path_refusal(model, task)
    if refusal is not None:
        raise UnsupportedModelError(f"{who} needs a model proven per-sample before training, and {refusal}: {FIX}")


def refuse_in_place_layers(model: nn.Module) -> None:
    """Layers whose forward changes a parameter in place (what moved reveals which inputs were in the batch)."""
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding) and module.max_norm is not None:
            raise UnsupportedModelError(
                f"layer {name or '<root>'} (Embedding with max_norm={module.max_norm}) renormalises the rows it looks "
                "up in place inside forward, so the weights that move reveal which tokens were in the batch, without "
                "noise: drop max_norm, or renormalise the weight outside forward (e.g. after each optimizer step)"
            )

