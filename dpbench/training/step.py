"""One logical private step, shared by the Lightning module and the plain-loop wrapper so that both form, apply and
account the step the same way.

Three properties hold by construction at every step, whatever the model does, because they are checked on the step's
own tensors and state rather than on sampled steps: no forward of the private step changes a parameter, a buffer or a
module's own attribute (the change would be a release of the batch without noise: `nn.Embedding(max_norm=...)` moves
the rows it looked up; a running maximum read with `.item()` carries one sample into the others' forwards and into
later steps); no gradient hook of the user's runs on a privatized gradient (it would scale what was clipped); and no
private step applies or leaves a NaN or inf (one record can make a shared backward NaN: a perfect membership test).
Under autocast (trainer.precision=bf16-mixed) only the model's forward runs at bf16: the step itself runs with autocast
off, so its norms, clipping, sums, noise and update are float32 (per_sample.precision).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from dpbench.core.errors import ConfigurationError, NonFiniteStepError, UnsupportedModelError
from dpbench.core.tasks import Batch, Task
from dpbench.privacy.ledger import PrivacyLedger
from dpbench.privatizers import mixed_precision_privatizers
from dpbench.privatizers.base import PrivatizerStrategy, StepContext, StepOutput
from dpbench.privatizers.per_sample.precision import check_step_precision, float32_step

MODULE_MACHINERY = frozenset(vars(nn.Module())) | {"forward"}
"""What every nn.Module keeps in its __dict__ (and dpbench's temporary forward of a recurrent layer): not the model's
own state."""


def _value(value: object, depth: int = 0) -> object:
    """What tells whether an attribute changed: a tensor's identity and version, a scalar's value, a container's
    identity and length."""
    if isinstance(value, Tensor):
        return ("tensor", id(value), value._version)
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return value
    if isinstance(value, tuple) and depth < 2:
        return tuple(_value(item, depth + 1) for item in value)
    if isinstance(value, (list, dict, set)):
        return ("container", id(value), len(value))
    return ("object", id(value))


def _states(model: nn.Module) -> dict[str, object]:
    """Each parameter's and buffer's identity and version counter (bumped by every in-place change), and each
    module's own attributes."""
    states: dict[str, object] = {name: (id(t), t._version)
                                 for name, t in itertools.chain(model.named_parameters(), model.named_buffers())}
    for name, module in model.named_modules():
        for key, value in vars(module).items():
            if key not in MODULE_MACHINERY:
                states[f"{name}.{key}" if name else key] = _value(value)
    return states


def _refuse_parameter_hooks(model: nn.Module) -> None:
    for name, param in model.named_parameters():
        if param.requires_grad and (param._backward_hooks or getattr(param, "_post_accumulate_grad_hooks", None)):
            raise UnsupportedModelError(
                f"parameter {name} has a gradient hook of its own (Tensor.register_hook or "
                "register_post_accumulate_grad_hook), which would change a privatized gradient after its clipping (or "
                "be skipped silently): remove it, and scale a layer's updates through its own optimizer parameter "
                "group's learning rate instead"
            )


def _refuse_changes(model: nn.Module, before: dict[str, object], step: int) -> None:
    after = _states(model)
    changed = sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
    if changed:
        raise UnsupportedModelError(
            f"at step {step} the model's forward changed {', '.join(changed[:5])}{' ...' if len(changed) > 5 else ''} "
            "in place (or replaced it) while the private gradient was formed, a release of the batch without noise; "
            "nothing of this step was applied: make that change outside forward (e.g. renormalise after the "
            "optimizer step) or drop it (nn.Embedding(max_norm=...): drop max_norm)"
        )


def _nonfinite(tensors: list[Tensor]) -> bool:
    if not tensors:
        return False
    norms = torch._foreach_norm(tensors)
    return not bool(torch.isfinite(torch.stack([n.float() for n in norms])).all())


def _refuse_nonfinite(model: nn.Module, what: str, step: int) -> None:
    params = [p for p in model.parameters() if p.requires_grad]
    tensors = [p.grad for p in params if p.grad is not None] if what == "gradient" else params
    if _nonfinite(tensors):
        raise NonFiniteStepError(
            f"at step {step} the privatized {what} is not finite (NaN or inf); the run stops "
            f"{'before applying it' if what == 'gradient' else 'before releasing the model'}: lower the learning "
            "rate, or find the op that overflows (a privatizer drops samples whose own gradient is not finite)"
        )


def _refuse_narrow_weights(model: nn.Module) -> None:
    narrow = [name for name, p in model.named_parameters()
              if p.requires_grad and p.is_floating_point() and p.element_size() < 4]
    if narrow:
        raise ConfigurationError(
            f"trainable parameters {', '.join(narrow[:3])}{' ...' if len(narrow) > 3 else ''} are stored in "
            "half precision, which would round the noisy update away: keep float32 weights (the master copies) and "
            "run the forward at bf16 (trainer.precision=bf16-mixed, or torch.autocast)"
        )


@contextmanager
def privatizing(strategy: PrivatizerStrategy, model: nn.Module) -> Iterator[None]:
    """The private part of a step: autocast (if the step was called under it, and allowed) re-entered only by the
    model's forwards, everything else in float32 (per_sample.precision)."""
    device_type = next((p.device.type for p in model.parameters()), "cpu")
    dtype = check_step_precision(device_type, strategy.name, strategy.supports_mixed_precision,
                                 mixed_precision_privatizers)
    with float32_step(device_type, dtype):
        yield


def private_step(
    strategy: PrivatizerStrategy, model: nn.Module, task: Task, optimizer: Optimizer, ledger: PrivacyLedger,
    batch: Batch, ctx: StepContext,
) -> StepOutput:
    """The strategy's privatized gradient, its update, and (for a private strategy) the step's mechanisms in the
    ledger; a private step that changed the model in its forward, or that is not finite, is refused before its update
    (after it, for parameters the update made non-finite)."""
    optimizer.zero_grad(set_to_none=True)
    if strategy.is_private:
        _refuse_parameter_hooks(model)
        _refuse_narrow_weights(model)
    states = _states(model) if strategy.is_private else None
    with privatizing(strategy, model):
        try:
            output = strategy.privatize(model, task, batch, ctx)
        except UnsupportedModelError:
            if states is not None:  # a check that failed because the forward changed the model: name the cause
                _refuse_changes(model, states, ctx.step)
            raise
        if states is not None:
            _refuse_changes(model, states, ctx.step)
            _refuse_nonfinite(model, "gradient", ctx.step)
        strategy.apply_update(optimizer)
    if strategy.is_private:
        ledger.record(strategy.step_mechanisms(ctx.step))
        _refuse_nonfinite(model, "model", ctx.step)
    return output
