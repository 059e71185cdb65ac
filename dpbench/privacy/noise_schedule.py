"""Per-step noise schedules and their bucketed accounting (D2P2's decaying noise).

Step k (1-based) of T uses sigma_k = sigma * factor(k). For the accountant the T steps are grouped into at most
`buckets` runs of consecutive steps, each charged at the *smallest* sigma of its run: a smaller noise multiplier
dominates a larger one, so the bucketed composition upper-bounds the exact per-step one, while the accountant
composes a few distinct privacy random variables instead of T. The cuts minimise the charged cost proxy
sum_runs length / sigma_run^2 (a step's Gaussian / RDP cost is about 1 / sigma^2), so runs are short where the noise
is small and the privacy is spent; for sigma / sqrt(k) the proxy is over-charged by about (buckets + 1) / buckets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from dpbench.core.errors import ConfigurationError

DECAYS = ("inverse_sqrt", "exponential", "none")
CANDIDATES = 256
"""Grid of possible bucket boundaries (steps) searched for the cheapest bucketing."""


@dataclass(frozen=True)
class NoiseSchedule:
    decay: str = "inverse_sqrt"
    """inverse_sqrt: sigma / sqrt(k) (D2P2, Algorithm 1); exponential: sigma * rate^(-(k-1)/(T-1)) (Du et al.'s
    shape, the last step gets sigma / rate); none: constant sigma."""
    rate: float = 10.0
    """exponential only: ratio of the first to the last step's noise."""

    def __post_init__(self) -> None:
        if self.decay not in DECAYS:
            raise ConfigurationError(f"privatizer.noise_decay must be one of {DECAYS}, got {self.decay!r}")
        if not (math.isfinite(self.rate) and self.rate >= 1.0):
            raise ConfigurationError(f"privatizer.decay_rate must be a finite number >= 1, got {self.rate}")

    def factors(self, steps: np.ndarray, total: int) -> np.ndarray:
        """sigma_k / sigma for the 1-based steps k of a run of `total` steps."""
        steps = np.asarray(steps, dtype=np.float64)
        if self.decay == "inverse_sqrt":
            return 1.0 / np.sqrt(steps)
        if self.decay == "exponential":
            return self.rate ** (-(steps - 1) / max(total - 1, 1))
        return np.ones_like(steps)

    def factor(self, step: int, total: int) -> float:
        return float(self.factors(np.array([step]), total)[0])

    def buckets(self, total: int, count: int) -> tuple[tuple[int, float], ...]:
        """(last 1-based step, smallest factor) of each run of consecutive steps; equal factors merged."""
        return _buckets(self, total, count)


@lru_cache(maxsize=64)
def _buckets(schedule: NoiseSchedule, total: int, count: int) -> tuple[tuple[int, float], ...]:
    """Cuts among CANDIDATES grid points that minimise the charged cost sum_runs length / smallest factor^2.

    Every schedule in DECAYS is non-increasing, so a run's smallest factor is its last step's.
    """
    if total < 1 or count < 1:
        raise ValueError(f"need at least one step and one bucket, got {total} steps and {count} buckets")
    factors = schedule.factors(np.arange(1, total + 1), total)
    points = np.unique(np.linspace(0, total, min(total, CANDIDATES) + 1).round().astype(np.int64))
    step_cost = 1.0 / factors[points[1:] - 1] ** 2  # cost per step of a run ending at points[m]
    best = np.full(points.size, np.inf)
    best[0] = 0.0
    choices = []
    for _ in range(count):  # best[m]: cheapest cover of steps 1..points[m] with the runs placed so far
        charged = best[None, :-1] + (points[1:, None] - points[None, :-1]) * step_cost[:, None]
        charged[np.triu_indices(points.size - 1, 1)] = np.inf  # a run must end after it starts
        previous = charged.argmin(axis=1)
        improved = np.concatenate([[best[0]], np.minimum(best[1:], charged.min(axis=1))])
        choices.append(np.concatenate([[0], np.where(charged.min(axis=1) < best[1:], previous, -1)]))
        best = improved
    runs: list[tuple[int, float]] = []
    m = points.size - 1
    for choice in reversed(choices):  # walk back from the end; -1 means "no new run in this round"
        if m == 0:
            break
        if choice[m] < 0:
            continue
        runs.append((int(points[m]), float(factors[points[m] - 1])))
        m = int(choice[m])
    merged: list[tuple[int, float]] = []
    for end, smallest in reversed(runs):
        if merged and merged[-1][1] == smallest:
            merged[-1] = (end, smallest)
        else:
            merged.append((end, smallest))
    return tuple(merged)
