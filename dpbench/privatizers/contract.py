"""The accounting contract every privatizer keeps, checked where a strategy is made (before any training).

A private strategy's `composition(sigma, steps)` must return a non-empty list of (Mechanism, count) pairs with at
least one non-trivial mechanism applied a positive number of times, and `step_mechanisms(step)` a non-empty list of
Mechanism: what calibration searches over and what the ledger composes. An empty composition would account
epsilon 0 and calibrate the noise to nothing, so it is refused, never taken as "free". A schedule that changes over
the run lists its pairs in step order, one mechanism per step.

That step_mechanisms() reports no less than composition() declares cannot be checked here (it depends on the steps
taken); the ledger checks it at every epsilon() and reports the larger figure (dpbench.privacy.ledger).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dpbench.core.errors import ConfigurationError
from dpbench.privacy.mechanisms import Composition, Mechanism
from dpbench.privatizers.base import PrivatizerStrategy

CONTRACT = ("must return a non-empty list of (dpbench.Mechanism, steps) pairs describing every release of the run "
            "(see docs/plugins.md)")


def _refuse(strategy: Any, what: str) -> ConfigurationError:
    return ConfigurationError(f"privatizer {getattr(strategy, 'name', type(strategy).__name__)!r}: {what}")


class CheckedComposition:
    """strategy.composition, refused when it breaks the contract (a class, not a closure: strategies pickle)."""

    def __init__(self, strategy: PrivatizerStrategy, composition: Callable[[float, int], Composition]):
        self.strategy = strategy
        self.composition = composition

    def __call__(self, noise_multiplier: float, steps: int) -> Composition:
        result = self.composition(noise_multiplier, steps)
        if not isinstance(result, (list, tuple)):
            raise _refuse(self.strategy, f"composition() returned {result!r}; it {CONTRACT}")
        for pair in result:
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], Mechanism)
                    and isinstance(pair[1], int) and pair[1] >= 0):
                raise _refuse(self.strategy, f"composition() returned the entry {pair!r}; it {CONTRACT}")
        if steps > 0 and not any(count > 0 and not mechanism.is_trivial for mechanism, count in result):
            raise _refuse(self.strategy, f"composition() describes no private release for {steps} steps "
                                         f"(got {list(result)!r}); it {CONTRACT}")
        return list(result)


class CheckedStepMechanisms:
    """strategy.step_mechanisms, refused when a private step reports no mechanism (the ledger would compose 0)."""

    def __init__(self, strategy: PrivatizerStrategy, step_mechanisms: Callable[[int], list[Mechanism]]):
        self.strategy = strategy
        self.step_mechanisms = step_mechanisms

    def __call__(self, step: int) -> list[Mechanism]:
        result = self.step_mechanisms(step)
        if not (isinstance(result, (list, tuple)) and result and all(isinstance(m, Mechanism) for m in result)):
            raise _refuse(self.strategy, f"step_mechanisms({step}) returned {result!r}; it must return a non-empty "
                                         "list of dpbench.Mechanism")
        return list(result)


def check_contract(strategy: Any) -> None:
    """Refuse what cannot be accounted; wrap a private strategy's composition and step mechanisms with checks."""
    if not isinstance(strategy, PrivatizerStrategy):
        raise _refuse(strategy, f"{type(strategy).__qualname__} is not a dpbench.PrivatizerStrategy subclass")
    if not strategy.is_private:
        return
    for method in ("composition", "step_mechanisms"):
        if not callable(getattr(type(strategy), method, None)):
            raise _refuse(strategy, f"{method}() is missing; a private strategy {CONTRACT}")
    strategy.composition = CheckedComposition(strategy, strategy.composition)  # type: ignore[method-assign]
    strategy.step_mechanisms = CheckedStepMechanisms(strategy, strategy.step_mechanisms)  # type: ignore[method-assign]
