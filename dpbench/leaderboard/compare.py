"""Paired comparisons over seeds, their tests, and how a best method is chosen apart from the seeds that test it.

Two methods run with the same seed share that seed's initialisation, dropout and validation split; their Poisson
batches and noise come from a fresh secret root per run (dpbench.privacy.randomness), so they do not share those. A
comparison still pairs them seed by seed (the paired t test is valid either way; it removes only the spread the seed
itself causes): the mean difference, its Student-t 95% interval, and the paired t test of a claim's line (0 for
"better", minus a margin for "close"). The verdicts themselves are decided over the whole family of claims the
report makes (family.py), never one comparison at a time.

A paper's claim is judged against its paper's baseline, fixed before any result is read: the vanilla method with the
claimed method's optimizer (DP-SGD for JL and D2P2, DP-Adam for GRAPE and sparse), so that the comparison isolates
the method and not the optimizer. The best method at a budget, and the vanilla method it is compared with, are
chosen on the selection runs (the validation value of each method's chosen tuning trial), not on the evaluation
seeds: picking the best of several methods on the seeds that then test it would favour whichever one those seeds
happened to flatter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import mean, stdev

from scipy.stats import t as student_t

from dpbench.leaderboard.summary import Entry
from dpbench.report.stats import interval95

HOLDS, FAILS, UNCLEAR = "holds", "does not hold", "not distinguishable at this budget"
BASELINES = ("dpsgd", "dpadam")


@dataclass(frozen=True)
class Paired:
    """method - baseline over the seeds both ran, signed so that positive is better (a loss's sign flipped)."""

    difference: float
    interval: tuple[float, float] | None
    seeds: int
    metric: str | None
    differences: tuple[float, ...] = ()

    def text(self) -> str:
        """'+1.2 points [-0.3, +2.7] over 3 paired seeds' (accuracy), or a loss's own difference (lower is better:
        '-1.000 in loss [...]')."""
        body = self.amount(self.difference)
        if self.interval is None:
            return f"{body} (one seed: no interval)"
        low, high = sorted(self._sign * x for x in self.interval)
        return f"{body} [{self._number(low)}, {self._number(high)}] over {self.seeds} paired seeds"

    def amount(self, difference: float) -> str:
        """A signed difference in the metric's own direction and units: '-2.0 points', or a loss's '+0.100 in loss'
        (higher: worse), so that a '+' is never read as better on a loss."""
        unit = {"accuracy": " points", "loss": " in loss"}.get(self.metric or "", "")
        return self._number(self._sign * difference) + unit

    @property
    def _sign(self) -> float:
        return -1.0 if self.metric == "loss" else 1.0  # back to the metric's own direction

    def _number(self, x: float) -> str:
        return f"{100 * x:+.1f}" if self.metric == "accuracy" else f"{x:+.3f}"

    def p_value(self, line: float) -> float | None:
        """Two-sided paired t test of a mean difference equal to `line`; None under two seeds (no spread). Seeds
        that all differ by the same amount give 0 off the line and 1 on it: their interval is a point."""
        if len(self.differences) < 2:
            return None
        spread = stdev(self.differences)
        centre = mean(self.differences) - line
        if spread == 0.0:
            return 1.0 if math.isclose(centre, 0.0, abs_tol=1e-12) else 0.0
        statistic = centre / (spread / math.sqrt(len(self.differences)))
        return float(2 * student_t.sf(abs(statistic), len(self.differences) - 1))


def paired(method: Entry, baseline: Entry) -> Paired | None:
    """The paired difference over the seeds both entries finished, or None when they share none."""
    seeds = sorted(set(method.by_seed) & set(baseline.by_seed))
    if not seeds:
        return None
    sign = -1.0 if method.metric == "loss" else 1.0
    differences = [sign * (method.by_seed[s] - baseline.by_seed[s]) for s in seeds]
    return Paired(mean(differences), interval95(differences), len(seeds), method.metric, tuple(differences))


def chosen_on_selection(entries: list[Entry]) -> bool:
    """Whether the choice among the candidates never reads a test seed: every one has a selection score, or there
    is only one (a recipe task running one method chooses nothing)."""
    return len(entries) == 1 or _scored(entries)


def _scored(entries: list[Entry]) -> bool:
    return bool(entries) and all(e.selection is not None for e in entries)


def best_of(entries: list[Entry]) -> Entry:
    """The best candidate: by selection score where every one has it, else by test mean; on a tie the one listed
    first (the suite's order)."""
    sign = -1.0 if entries[0].metric == "loss" else 1.0
    on_selection = _scored(entries)
    return max(entries, key=lambda e: sign * (e.selection if on_selection else e.mean))


def best_baseline(entries: list[Entry], epsilon: float | None) -> Entry | None:
    """The task's best vanilla private method at that budget (DP-SGD or DP-Adam: best_of)."""
    found = [e for e in entries if e.method in BASELINES and e.epsilon == epsilon and e.mean is not None]
    return best_of(found) if found else None


STAND_IN = {"unknown": "this method's optimizer is not recorded: the better vanilla method stands in",
            "not run": "the paper's baseline, the vanilla method with this method's optimizer, is not run here"}
"""Why a claim is judged against a stand-in instead of its paper's baseline, as its sentence says."""


def paper_baseline(entries: list[Entry], method: Entry) -> tuple[Entry | None, str | None]:
    """The vanilla method at `method`'s budget with its optimizer, and None; where the task runs no vanilla method
    with that optimizer at all (or the optimizer is not recorded), the best vanilla method and the STAND_IN key. A
    paper's baseline that runs but has no result yet (pending, refused, failed) gives no baseline: the claim waits
    for it rather than being judged against another method."""
    at_budget = [e for e in entries if e.method in BASELINES and e.epsilon == method.epsilon]
    if method.optimizer is None:
        return best_baseline(entries, method.epsilon), "unknown"
    same = [e for e in at_budget if e.optimizer == method.optimizer]
    if not same:
        return best_baseline(entries, method.epsilon), "not run"
    return (same[0] if same[0].mean is not None else None), None
