"""Private coordinate selection over p coordinates of which only a few ("touched") have a non-zero score.

Every untouched coordinate has score 0, so the selections below never loop over all p: they draw the untouched
coordinates' part from its exact distribution (order statistics, geometric gaps) and pick their identities
uniformly. Randomness comes from the caller's numpy Generator (seeded, checkpointed), never the global RNG.
"""

from __future__ import annotations

import numpy as np


def uniform_untouched(touched: np.ndarray, p: int, m: int, rng: np.random.Generator) -> np.ndarray:
    """m distinct coordinates drawn uniformly from [0, p) minus the sorted array `touched` (O(m log |touched|)).

    Distinct ranks among the untouched coordinates are drawn without replacement; rank r maps to the coordinate
    r + #{touched t with t - (index of t) <= r}.
    """
    free = p - len(touched)
    if m > free:
        raise ValueError(f"cannot draw {m} of {free} untouched coordinates")
    ranks = rng.choice(free, size=m, replace=False) if m else np.empty(0, dtype=np.int64)
    shifted = touched - np.arange(len(touched))
    return ranks + np.searchsorted(shifted, ranks, side="right")


def exponential_top_k(touched: np.ndarray, utility: np.ndarray, p: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """k draws without replacement, each with probability proportional to exp(utility) (0 for untouched ones).

    Gumbel top-k is the same distribution as k sequential exponential-mechanism draws (Algorithm 4). The top m
    Gumbels of the n untouched coordinates come from the m smallest of n Exp(1) variables (Renyi's representation).
    """
    k = min(k, p)
    free = p - len(touched)
    keys = utility + rng.gumbel(size=len(touched))
    m = min(k, free)
    if m:
        smallest = np.cumsum(rng.exponential(size=m) / (free - np.arange(m)))
        keys = np.concatenate([keys, -np.log(smallest)])
    top = np.argpartition(-keys, k - 1)[:k] if k < len(keys) else np.arange(len(keys))
    from_touched = touched[top[top < len(touched)]]
    untouched = uniform_untouched(touched, p, int((top >= len(touched)).sum()), rng)
    return np.sort(np.concatenate([from_touched, untouched]))


def _laplace_tail(threshold: float, scale: float) -> float:
    """Pr[Lap(scale) >= threshold]."""
    if threshold >= 0:
        return 0.5 * np.exp(-threshold / scale)
    return 1.0 - 0.5 * np.exp(threshold / scale)


def _nth_untouched(touched: np.ndarray, start: int, n: int) -> int:
    """The (n+1)-th coordinate >= start that is not touched: the least fixed point of x = start + n + #touched."""
    x = start + n
    while True:
        count = np.searchsorted(touched, x, side="right") - np.searchsorted(touched, start)
        nxt = start + n + int(count)
        if nxt == x:
            return x
        x = nxt


def sparse_vector(touched: np.ndarray, score: np.ndarray, p: int, count: int, threshold: float,
                  threshold_scale: float, query_scale: float, rng: np.random.Generator) -> np.ndarray:
    """NumericSparse's selection (Algorithm 1, Dwork-Roth's Sparse): scan coordinates 0..p-1, select those whose
    noisy score clears a noisy threshold, refresh the threshold after each, halt after `count` selections.

    Each round is AboveThreshold (threshold noise Lap(2s/eps0), query noise Lap(4s/eps0)), pure eps0-DP.
    """
    noise = rng.laplace(scale=query_scale, size=len(touched))
    selected: list[int] = []
    position, j = 0, 0  # next coordinate to examine; first touched index >= position
    while len(selected) < count and position < p:
        level = threshold + rng.laplace(scale=threshold_scale)
        tail = _laplace_tail(level, query_scale)
        if tail <= 0.0:
            untouched = p
        else:
            gap = 0 if tail >= 1.0 else int(np.floor(np.log(rng.random()) / np.log1p(-tail)))
            untouched = min(p, _nth_untouched(touched, position, gap)) if gap < p else p
        end = int(np.searchsorted(touched, untouched))
        passes = np.flatnonzero(score[j:end] + noise[j:end] >= level)
        if len(passes):
            j += int(passes[0])
            chosen = int(touched[j])
            j += 1
        elif untouched < p:
            chosen, j = untouched, end
        else:
            break
        selected.append(chosen)
        position = chosen + 1
    return np.asarray(selected, dtype=np.int64)
