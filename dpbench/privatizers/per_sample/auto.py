"""privatizer.engine=auto (and functorch): an engine that proves itself on the first batch before it is trusted.

auto starts on the hook engine when every trainable layer has a rule. When the hooks cannot serve the model (a check
fires, or their first batch differs from per-example backward passes), it hands back the hooks, says which layer or
parameter forced it, and continues on functorch, which is exact for any model vmap (or its per-example loop) runs.
Functorch's first batch is checked too; a model neither engine serves is refused with both reasons.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from torch import Tensor, nn

from dpbench.errors import UnsupportedModelError
from dpbench.privatizers.clipping import FactorFn, clip_factors
from dpbench.privatizers.per_sample.base import ClippedSum, trainable_parameters
from dpbench.privatizers.per_sample.functorch import FunctorchEngine
from dpbench.privatizers.per_sample.hooks import HookEngine, unsupported_modules
from dpbench.privatizers.per_sample.verify import (
    checked_samples,
    describe,
    evaluation,
    mismatched,
    per_example_gradients,
    select,
    summarize,
)
from dpbench.tasks import Batch, Task, batch_size_of

log = logging.getLogger(__name__)

Result = TypeVar("Result")


def check_functorch(engine: FunctorchEngine, task: Task, batch: Batch) -> None:
    """vmap's per-sample gradients of a few samples against a forward and backward pass of each sample alone.

    In eval mode: vmap draws its own dropout masks, so a train-mode comparison would mismatch on randomness alone.
    """
    model = engine.model
    samples = checked_samples(batch_size_of(batch))
    bad: dict[str, float] = {}
    with evaluation(model):
        per_sample = engine.per_sample_gradients(task, select(batch, samples))
        reference = per_example_gradients(model, task, batch, trainable_parameters(model), samples)
        for k, expected in enumerate(reference):
            got = summarize({name: per_sample[name][k] for name in expected})
            bad |= mismatched(got, {}, summarize(expected))
    if bad:
        raise UnsupportedModelError(
            f"functorch's per-sample gradients of {describe(bad)} differ from per-example backward passes: "
            "use privatizer.engine=hooks if every layer of the model has a rule"
        )


class AutoEngine:
    """Delegates to `engine`: the hook engine while it serves the model, else the functorch engine."""

    def __init__(self, model: nn.Module, chunk_size: int | None = None, hooks: bool = True):
        self.model = model
        self.chunk_size = chunk_size
        self.engine: HookEngine | FunctorchEngine
        unsupported = unsupported_modules(model) if hooks else []
        self._hooks_refusal = f"no per-sample rule for {', '.join(unsupported)}" if unsupported else None
        if hooks and not unsupported:
            self.engine = HookEngine(model)
        else:
            self.engine = FunctorchEngine(model, chunk_size=chunk_size)
        self._functorch_checked = False

    def per_sample_gradients(self, task: Task, batch: Batch) -> dict[str, Tensor]:
        return self._run(task, batch, lambda engine: engine.per_sample_gradients(task, batch))

    def clipped_sum(
        self, task: Task, batch: Batch, clip_norm: float, factor_fn: FactorFn = clip_factors
    ) -> ClippedSum:
        return self._run(task, batch, lambda engine: engine.clipped_sum(task, batch, clip_norm, factor_fn))

    def _run(self, task: Task, batch: Batch, step: Callable[[HookEngine | FunctorchEngine], Result]) -> Result:
        if isinstance(self.engine, HookEngine):
            try:
                return step(self.engine)
            except UnsupportedModelError as refusal:
                self._fall_back(refusal)
        if not self._functorch_checked:
            self._check_functorch(task, batch)
        return step(self.engine)

    def _fall_back(self, refusal: UnsupportedModelError) -> None:
        """The hooks refused before producing any number: hand them back and continue on functorch."""
        self.engine.detach()
        self._hooks_refusal = str(refusal)
        log.warning("privatizer.engine=auto: the hook engine cannot serve this model, falling back to functorch "
                    "(slower): %s", refusal)
        self.engine = FunctorchEngine(self.model, chunk_size=self.chunk_size)

    def _check_functorch(self, task: Task, batch: Batch) -> None:
        try:
            check_functorch(self.engine, task, batch)
        except (UnsupportedModelError, RuntimeError, NotImplementedError) as error:
            hooks = f"the hook engine refused it ({self._hooks_refusal}), and " if self._hooks_refusal else ""
            raise UnsupportedModelError(
                f"no per-sample gradient engine is exact for this model: {hooks}functorch failed ({error})"
            ) from error
        self._functorch_checked = True
