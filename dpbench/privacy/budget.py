"""How many steps fit in an epsilon budget at a fixed noise multiplier (privacy.stop_on_budget)."""

from __future__ import annotations

from collections.abc import Callable

from dpbench.privacy.accountant import PrivacyAccountant
from dpbench.privacy.mechanisms import Composition


def steps_within_budget(
    composition_for_steps: Callable[[int], Composition], epsilon: float, delta: float, max_steps: int,
    accountant: PrivacyAccountant,
) -> int:
    """Largest T <= max_steps whose composed epsilon is <= epsilon (epsilon grows with T: bisection)."""

    def within(steps: int) -> bool:
        return accountant.epsilon(composition_for_steps(steps), delta).epsilon <= epsilon

    if within(max_steps):
        return max_steps
    low, high = 0, max_steps  # within(low), not within(high)
    while high - low > 1:
        middle = (low + high) // 2
        if within(middle):
            low = middle
        else:
            high = middle
    return low
