"""privatizer.engine=auto (and functorch): an engine that proves itself before it is trusted.

auto runs a model that is not proven per-sample (construction.py: a model of your own code) on functorch from the
start, and moves a proven one to functorch before any step at which it no longer is (a module swapped, a hook added).
Otherwise it starts on the hook engine when every trainable layer has a rule. When the hooks cannot serve the model
(a check fires, or a batch's per-sample gradients differ from per-example backward passes, before the first step or
at a check during training), it hands back the hooks, says which layer or parameter forced it, and continues on
functorch, which is exact for any model vmap (or its per-example loop) runs: each sample's gradient is that of its own
loss alone. Functorch's first batch is checked too; a model neither engine serves is refused with both reasons. A switch
during training is recorded (CheckSchedule.switched): the steps before it were clipped with the hooks' gradients.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import torch
from torch import Tensor, nn

from dpbench.core.errors import UnsupportedModelError
from dpbench.core.tasks import Batch, Task, batch_size_of
from dpbench.privatizers.clipping import FactorFn, clip_factors
from dpbench.privatizers.per_sample.base import ClippedSum, trainable_parameters
from dpbench.privatizers.per_sample.check_schedule import CheckSchedule
from dpbench.privatizers.per_sample.construction import VMAP, fast_path_refusal
from dpbench.privatizers.per_sample.functorch import FunctorchEngine
from dpbench.privatizers.per_sample.hooks import HookEngine, PerSampleMismatch, unsupported_modules
from dpbench.privatizers.per_sample.verify import (
    as_trained_without_dropout,
    describe,
    deviation,
    evaluation,
    merge,
    mismatched,
    per_example_deviations,
    select,
)
from dpbench.privatizers.sharding import sharded_model

log = logging.getLogger(__name__)

Result = TypeVar("Result")


def check_functorch(engine: FunctorchEngine, task: Task, batch: Batch, samples: list[int]) -> None:
    """vmap's per-sample gradients of a few samples against a forward and backward pass of each sample alone, in
    training mode with dropout off (vmap would draw its own masks). A model that still draws random numbers is
    compared in eval mode: functorch's gradients are each sample's own by construction, so the check is of vmap's
    tracing, which the mode does not change."""
    model = engine.model
    params = trainable_parameters(model)
    with as_trained_without_dropout(model) as draws:
        per_sample = engine.per_sample_gradients(task, select(batch, samples))
        random = draws.drawn()
    bad: dict[str, float] = {}
    with evaluation(model) if random else as_trained_without_dropout(model):
        if random:
            per_sample = engine.per_sample_gradients(task, select(batch, samples))
        for k, i in enumerate(samples):
            def compare(name: str, param: nn.Parameter, grad: Tensor | None, k: int = k):
                got = per_sample[name][k].clone()
                return deviation(got, float(got.norm()), torch.zeros_like(param) if grad is None else grad)

            bad = merge(bad, mismatched(per_example_deviations(model, task, batch, i, params, compare)))
    if bad:
        raise UnsupportedModelError(
            f"functorch's per-sample gradients of {describe(bad)} differ from per-example backward passes: "
            "use privatizer.engine=hooks if every layer of the model has a rule"
        )


class AutoEngine:
    """Delegates to `engine`: the hook engine while it serves the model, else the functorch engine."""

    def __init__(
        self, model: nn.Module, chunk_size: int | None = None, hooks: bool = True, checks: CheckSchedule | None = None
    ):
        self.model = model
        self.chunk_size = chunk_size
        self.checks = checks if checks is not None else CheckSchedule()
        self.engine: HookEngine | FunctorchEngine
        unproven = fast_path_refusal(model) if hooks else None
        unsupported = unsupported_modules(model) if hooks and unproven is None else []
        self._hooks_refusal = unproven or (f"no per-sample rule for {', '.join(unsupported)}" if unsupported else None)
        if unproven is not None:
            log.info("privatizer.engine=auto: per-sample gradients by vmap (functorch, exact by construction), as %s",
                     unproven)
        if hooks and not unsupported and unproven is None:
            self.engine = HookEngine(model, self.checks)
        else:
            self.engine = self._functorch(self._hooks_refusal)
        self._functorch_checked = False

    def per_sample_gradients(self, task: Task, batch: Batch) -> dict[str, Tensor]:
        return self._run(task, batch, lambda engine: engine.per_sample_gradients(task, batch))

    def clipped_sum(
        self, task: Task, batch: Batch, clip_norm: float, factor_fn: FactorFn = clip_factors
    ) -> ClippedSum:
        return self._run(task, batch, lambda engine: engine.clipped_sum(task, batch, clip_norm, factor_fn))

    def _run(self, task: Task, batch: Batch, step: Callable[[HookEngine | FunctorchEngine], Result]) -> Result:
        if isinstance(self.engine, HookEngine) and self.checks.switched is not None:  # resumed after a switch
            self.engine.detach()
            self.engine = self._functorch(self.checks.switched["reason"])
        if isinstance(self.engine, HookEngine):
            try:  # a model no longer proven is refused by the hooks before this step's numbers, and falls back
                return step(self.engine)
            except UnsupportedModelError as refusal:
                self._fall_back(refusal)
        if not self._functorch_checked:
            self._check_functorch(task, batch)
        return step(self.engine)

    def _fall_back(self, refusal: UnsupportedModelError) -> None:
        """The hooks refused before producing this step's numbers: hand them back and continue on functorch."""
        self.engine.detach()
        self._hooks_refusal = str(refusal)
        if isinstance(refusal, PerSampleMismatch):
            self.checks.switched = {"step": refusal.step, "from": "hooks", "to": "functorch",
                                    "parameters": refusal.parameters, "reason": str(refusal)}
            log.error("privatizer.engine=auto: switching to functorch (exact) from step %d on: %s", refusal.step,
                      refusal)
        else:
            log.warning("privatizer.engine=auto: the hook engine cannot serve this model, falling back to functorch "
                        "(slower): %s", refusal)
        self.engine = self._functorch(str(refusal))

    def detach(self) -> None:
        if isinstance(self.engine, HookEngine):
            self.engine.detach()

    def _functorch(self, reason: str | None) -> FunctorchEngine:
        if sharded_model(self.model):
            raise UnsupportedModelError(
                f"trainer.strategy=fsdp needs the hook engine (vmap cannot run FSDP2's sharded parameters), and it "
                f"does not serve this model: {reason}"
            )
        self.checks.engine = {"name": "functorch", "why": VMAP + (f"; the hooks do not serve it: {reason}" if reason
                                                                   else "")}
        return FunctorchEngine(self.model, chunk_size=self.chunk_size)

    def _check_functorch(self, task: Task, batch: Batch) -> None:
        try:
            check_functorch(self.engine, task, batch, self.checks.samples(batch_size_of(batch)))
        except (UnsupportedModelError, RuntimeError, NotImplementedError) as error:
            hooks = f"the hook engine refused it ({self._hooks_refusal}), and " if self._hooks_refusal else ""
            raise UnsupportedModelError(
                f"no per-sample gradient engine is exact for this model: {hooks}functorch failed ({error})"
            ) from error
        self._functorch_checked = True
