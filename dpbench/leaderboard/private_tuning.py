"""`python -m dpbench.leaderboard --private-tuning --plan`: what Papernot-Steinke private tuning would cost each
method of a profile, beside its per-run epsilon, without running a cell.

Each method's tuning trial and final run are composed exactly as their cells would run them (`dpbench.app.run.
prepare_run` on the cells' overrides: data split, sampling rate, steps, calibrated noise), and their compositions go
to `dpbench.privacy.tuning`: the selection over a random number of trials (each trial's training run plus its
noisy validation score), composed with the final run at each budget.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from dpbench.app.hydra_setup import compose
from dpbench.core.errors import ConfigurationError
from dpbench.leaderboard.suite import Method, Suite, Task, Variant
from dpbench.leaderboard.trial_cells import cell_for, start_grid, trial_cell
from dpbench.privacy.mechanisms import Composition
from dpbench.privacy.tuning import TrialCount, TuningEpsilon, check_accountable, tuning_epsilon
from dpbench.privacy.tuning_draws import score_sensitivity

DEFAULT_SHAPE = 1.0
"""Geometric: at least one trial, and a tail a compute budget can plan for. Measured on the CNN task's trial at mean 8
(tuning alone, epsilon; 99th percentile of K): logarithmic 5.2, 62 trials; geometric 6.0, 35; Poisson 6.4, 15 (at
mean 3 Poisson costs least, 4.5 against 5.1, but it draws no trial at all with probability e^-mean)."""
DEFAULT_SCORE_NOISE = 10.0
"""The validation score's noise multiplier: std 10/n (2 points of accuracy at 500 validation examples, about the
split's own sampling error), which adds little to a trial's privacy loss next to its training run."""


@dataclass(frozen=True)
class PrivateTuning:
    """How tuning is made private: the law of the number of trials and the validation score's noise multiplier."""

    trials: TrialCount
    score_noise_multiplier: float = DEFAULT_SCORE_NOISE

    def __post_init__(self) -> None:
        if not (math.isfinite(self.score_noise_multiplier) and self.score_noise_multiplier > 0):
            raise ConfigurationError(f"the validation score's noise multiplier (--score-noise) must be positive and "
                                     f"finite (an exact score is not private), got {self.score_noise_multiplier!r}")


@dataclass(frozen=True)
class RunPrivacy:
    """What a cell's run composes, as its `python -m dpbench` would plan it."""

    composition: Composition
    epsilon: float
    """dpbench's own (PRV) epsilon of the run: the per-run figure the leaderboard reports."""
    examples: int
    """Validation examples (a tuning trial) that its score averages over."""
    metric: str
    """accuracy (range 1) or loss (unbounded: its noisy score needs the loss clipped to a range first)."""


@dataclass(frozen=True)
class PlanRow:
    task: str
    label: str
    budget: float | None
    per_run: float | None
    """The final run's dpbench (PRV) epsilon."""
    accounted: TuningEpsilon | None
    score_std: str | None
    """The noisy validation score's standard deviation."""
    reason: str | None = None
    """Why this method's tuning is not accounted (None when it is)."""


def run_privacy(overrides: list[str]) -> RunPrivacy:
    """Plan one cell's run (refusals raise ConfigurationError, as the cell would be refused)."""
    from dpbench.app.run import prepare_run

    prepared = prepare_run(compose(overrides))
    plan = prepared.plan
    composition = prepared.strategy.composition(plan.noise_multiplier, prepared.budget_steps)
    validation = prepared.data.validation
    return RunPrivacy(composition, plan.planned_epsilon, 0 if validation is None else len(validation),
                      prepared.data.task.metric_name)


def plan_rows(suite: Suite, tuning: PrivateTuning) -> Iterator[PlanRow]:
    """One row per private variant and budget; a row with the reason where a cell is refused or its tuning cannot
    be accounted."""
    for task in suite.tasks:
        skip = task.skip_reason()
        if skip:
            yield PlanRow(task.name, "(all methods)", None, None, None, None, skip)
            continue
        for method in (m for m in task.methods if m.private):
            for variant in method.variants():
                yield from _variant_rows(suite, task, method, variant, tuning)


def _variant_rows(suite: Suite, task: Task, method: Method, variant: Variant,
                  tuning: PrivateTuning) -> Iterator[PlanRow]:
    lr, clip = start_grid(suite, task, method).points()[0]  # neither changes sigma, q or the steps
    trials: dict[float, RunPrivacy | str] = {}
    for budget in suite.budgets:
        where = suite.tuning_budget(budget)
        if where not in trials:
            trials[where] = _trial(suite, task, method, variant, where, lr, clip)
        trial = trials[where]
        if isinstance(trial, str):
            yield PlanRow(task.name, variant.label, budget, None, None, None, trial)
            continue
        try:
            final = run_privacy(cell_for(suite, task, method, variant, "test", budget, suite.seeds[0], None, lr,
                                         clip).overrides)
        except ConfigurationError as error:
            yield PlanRow(task.name, variant.label, budget, None, None, None, f"refused: {error}")
            continue
        try:
            accounted = tuning_epsilon(trial.composition, final.composition, tuning.trials, task.delta,
                                       tuning.score_noise_multiplier, finals=len(suite.seeds))
        except ConfigurationError as error:
            yield PlanRow(task.name, variant.label, budget, final.epsilon, None, None,
                          f"private tuning not accounted: {error}")
            continue
        score_std = f"{tuning.score_noise_multiplier * score_sensitivity(trial.examples):.3g}" + (
            "" if trial.metric == "accuracy" else f" times the {trial.metric}'s clipping range")
        yield PlanRow(task.name, variant.label, budget, final.epsilon, accounted, score_std)


def _trial(suite: Suite, task: Task, method: Method, variant: Variant, epsilon: float, lr: float,
           clip: float | None) -> RunPrivacy | str:
    """One tuning trial's privacy at `epsilon`, or why it cannot be accounted."""
    try:
        trial = run_privacy(trial_cell(suite, task, method, variant, epsilon, 0, lr, clip).overrides)
    except ConfigurationError as error:
        return f"its tuning trial is refused: {error}"
    try:
        check_accountable(trial.composition)  # sparse's selections: before planning the final runs
    except ConfigurationError as error:
        return f"private tuning not accounted: {error}"
    return trial


def describe(row: PlanRow) -> str:
    """One row as a line: 'epsilon 3.00 per run, 4.6 with tuning' and the figures behind it."""
    where = f"{row.task} / {row.label}" + ("" if row.budget is None else f" at epsilon {row.budget:g}")
    if row.accounted is None:
        per_run = "" if row.per_run is None else f"epsilon {row.per_run:.2f} per run; "
        return f"{where}: {per_run}{row.reason}"
    figures = row.accounted
    tail = "" if not figures.tail_mass else (f"; each random-sensitivity step's scale tail of mass "
                                              f"{figures.tail_mass:.2g} left out of its RDP and charged to delta")
    return (f"{where}: epsilon {row.per_run:.2f} per run, {figures.with_tuning:.2f} with tuning and "
            f"{figures.finals} final run(s) (RDP: "
            f"{figures.per_run:.2f} per run, {figures.tuning:.2f} the tuning alone; delta {figures.delta:g}; "
            f"validation score noise std {row.score_std}{tail})")


def header(suite: Suite, tuning: PrivateTuning) -> str:
    law = tuning.trials
    return (f"Private tuning plan ({suite.profile} profile): trials ~ {law.name}, mean {law.mean:g}, drawn with "
            f"the secret privacy randomness; each trial trains at "
            f"{'the budget of the runs it tunes' if suite.tuning.each_budget else f'epsilon {suite.tune_epsilon:g}'}"
            f" on the training "
            f"split less the validation split and releases its validation score with Gaussian noise (noise "
            f"multiplier {tuning.score_noise_multiplier:g}, sensitivity 1/n for accuracy; a loss must first be "
            f"clipped to a range); only the best trial is released (Papernot & Steinke 2022, dp-accounting's "
            f"RepeatAndSelectDpEvent with its RDP accountant), then composed with every evaluation seed's final run "
            f"({len(suite.seeds)}) at each budget.")
