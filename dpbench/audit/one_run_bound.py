"""The epsilon lower bound of a one-run audit (Steinke, Nasr & Jagielski 2023, "Privacy auditing with one (1)
training run", Theorem 3.1 with its delta term, Proposition 5.2 / Algorithm 2).

m canaries, each included independently with probability 1/2; the attacker guesses r of them (in or out) and v
guesses are right. If training is (epsilon, delta)-DP then, whatever the attacker did,
    P[V >= v] <= P[Binomial(r, p) >= v] + 2 m delta * max_{i=1..v} P[v - i <= Binomial(r, p) < v] / i,
    p = e^epsilon / (1 + e^epsilon),
so every epsilon whose right-hand side is at most beta is rejected at confidence 1 - beta; the lower bound is the
largest rejected epsilon.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats


def p_value(canaries: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """Probability of at least `correct` right guesses out of `guesses` under (epsilon, delta)-DP."""
    if not 0 <= correct <= guesses <= canaries:
        raise ValueError(f"need 0 <= correct ({correct}) <= guesses ({guesses}) <= canaries ({canaries})")
    p = 1.0 / (1.0 + math.exp(-epsilon))
    tail = float(stats.binom.sf(correct - 1, guesses, p))
    if correct == 0 or delta == 0:
        return min(1.0, tail)
    below = stats.binom.pmf(np.arange(correct - 1, -1, -1), guesses, p)  # P[B = v-1], P[B = v-2], ..., P[B = 0]
    worst = float(np.max(np.cumsum(below) / np.arange(1, correct + 1)))
    return min(1.0, tail + 2 * canaries * delta * worst)


def epsilon_lower_bound(canaries: int, guesses: int, correct: int, delta: float, beta: float) -> float:
    """Largest epsilon rejected at confidence 1 - beta (0 when none is): bisection, p_value grows with epsilon."""
    if p_value(canaries, guesses, correct, 0.0, delta) > beta:
        return 0.0
    low, high = 0.0, 1.0
    while p_value(canaries, guesses, correct, high, delta) <= beta:
        low, high = high, 2 * high
        if high > 1e3:  # v = r guesses right with a tiny beta: the data reject every epsilon we can name
            return low
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (middle, high) if p_value(canaries, guesses, correct, middle, delta) <= beta else (low, middle)
    return low
