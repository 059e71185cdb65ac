"""Paired comparisons over seeds, and the three verdicts a comparison can support.

Two methods run with the same seeds share their data order and initialisation draws, so a comparison pairs them
seed by seed: the mean difference and its Student-t 95% interval. A claim "holds" only where the interval lies on
its side, "does not hold" where it lies on the other side, and is "not distinguishable at this budget" otherwise
(one seed gives no interval, so nothing is distinguishable from it).
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import mean

from dpbench.leaderboard.summary import Entry
from dpbench.report.stats import interval95

HOLDS, FAILS, UNCLEAR = "holds", "does not hold", "not distinguishable at this budget"


@dataclass(frozen=True)
class Paired:
    """method - baseline over the seeds both ran, signed so that positive is better (a loss's sign flipped)."""

    difference: float
    interval: tuple[float, float] | None
    seeds: int
    metric: str | None

    def text(self) -> str:
        """'+1.2 points [-0.3, +2.7] over 3 paired seeds' (accuracy), or a loss's own difference (lower is better)."""
        sign = -1.0 if self.metric == "loss" else 1.0  # back to the metric's own direction

        def number(x: float) -> str:
            return f"{100 * x:+.1f}" if self.metric == "accuracy" else f"{x:+.3f}"

        body = number(sign * self.difference) + (" points" if self.metric == "accuracy" else "")
        if self.interval is None:
            return f"{body} (one seed: no interval)"
        low, high = sorted(sign * x for x in self.interval)
        return f"{body} [{number(low)}, {number(high)}] over {self.seeds} paired seeds"


def paired(method: Entry, baseline: Entry) -> Paired | None:
    """The paired difference over the seeds both entries finished, or None when they share none."""
    seeds = sorted(set(method.by_seed) & set(baseline.by_seed))
    if not seeds:
        return None
    sign = -1.0 if method.metric == "loss" else 1.0
    differences = [sign * (method.by_seed[s] - baseline.by_seed[s]) for s in seeds]
    return Paired(mean(differences), interval95(differences), len(seeds), method.metric)


def better_verdict(comparison: Paired) -> str:
    """Whether the method is better than the baseline."""
    if comparison.interval is None:
        return UNCLEAR
    low, high = comparison.interval
    return HOLDS if low > 0 else FAILS if high < 0 else UNCLEAR


def close_verdict(comparison: Paired, tolerance: float) -> str:
    """Whether the method is no worse than the baseline by more than `tolerance` (a non-inferiority margin)."""
    if comparison.interval is None:
        return UNCLEAR
    low, high = comparison.interval
    return HOLDS if low > -tolerance else FAILS if high < -tolerance else UNCLEAR


def best_baseline(entries: list[Entry], epsilon: float | None) -> Entry | None:
    """The task's best vanilla private method at that budget (DP-SGD or DP-Adam, by mean)."""
    found = [e for e in entries if e.method in ("dpsgd", "dpadam") and e.epsilon == epsilon and e.mean is not None]
    if not found:
        return None
    sign = -1.0 if found[0].metric == "loss" else 1.0
    return max(found, key=lambda e: sign * e.mean)
