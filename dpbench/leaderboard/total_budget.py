"""A profile with `budget: total`: each cell's noise calibrated so that its whole procedure spends the budget.

Per (task, variant, budget) the procedure is the profile's K trials (each a training run on the training split less
the validation split, and its validation accuracy, or a loss task's capped validation loss, released with Gaussian
noise), then one final run per evaluation seed, all at one noise multiplier sigma. dpbench.privacy.procedure
composes them and calibrates sigma so that the total meets the budget; the choice among the trials is made on the
released noisy scores (post-processing). The record (budget_eps<E>.json beside the variant's cells) keeps sigma, the
total, the per-run figures and the released scores, so that a resumed suite reuses them and the report shows them;
it counts only for the overrides it was calibrated on (an edited suite entry calibrates again).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from dpbench.core.errors import ConfigurationError
from dpbench.core.results import write_json_atomic
from dpbench.core.tasks import Task, score_bound_of
from dpbench.privacy.accounting import epsilon
from dpbench.privacy.calibration import UnreachableEpsilonError
from dpbench.privacy.mechanisms import Composition
from dpbench.privacy.procedure import Procedure, calibrate_procedure, procedure_epsilon

PLANNING_OVERRIDES = ("privacy.allow_infinite_epsilon=true", "privacy.max_epsilon=null")
"""Planning a run at a placeholder sigma must not refuse it for that sigma's epsilon: only its composition is used."""


@dataclass(frozen=True)
class TotalBudget:
    """One variant's calibration at one total budget, and the scores its selection released."""

    target: float
    delta: float
    trials: int
    finals: int
    score_noise_multiplier: float
    inputs: list[list[str]]
    """The trial's and final run's overrides at a placeholder sigma: what was calibrated."""
    scored: bool = True
    """False: the task is scored by a loss without a bound, no noisy score is released, and its selection is not
    accounted (the report says so beside the cell)."""
    score_bound: float | None = None
    """A loss task's cap B (Task.score_bound): each trial releases its validation loss capped at B per example,
    whose sensitivity B/n scales the noise (z B/n) but not the Gaussian's epsilon. None: the score is accuracy."""
    noise_multiplier: float | None = None
    total: float | None = None
    per_run: float | None = None
    """One final run's epsilon: the per-run figure."""
    per_trial: float | None = None
    reason: str | None = None
    """Why the total cannot be reached (None when it is)."""
    scores: list[list[float | int | None]] = field(default_factory=list)
    """[trial, lr, clip, released noisy score] per finished trial."""

    def matches(self, other: TotalBudget) -> bool:
        """The same calibration problem (a record counts only for the inputs it was calibrated on)."""
        keep = ("target", "delta", "trials", "finals", "score_noise_multiplier", "inputs")
        return all(getattr(self, name) == getattr(other, name) for name in keep)

    def with_scores(self, scores: list[list[float | int | None]]) -> TotalBudget:
        return replace(self, scores=scores)


def budget_path(root: Path, task: str, variant: str, budget: float) -> Path:
    return Path(root) / task / variant / f"budget_eps{budget:g}.json"


def read_budget(path: Path) -> TotalBudget | None:
    return TotalBudget(**json.loads(path.read_text())) if path.exists() else None


def write_budget(path: Path, budget: TotalBudget) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, asdict(budget))


def composition_for(overrides: list[str]) -> tuple[Callable[[float], Composition], Task]:
    """The run's composition as a function of sigma, and its task, planned as its cell would run (a refusal
    raises ConfigurationError, as the cell would be refused)."""
    from dpbench.app.hydra_setup import compose
    from dpbench.app.run import prepare_run

    prepared = prepare_run(compose([*overrides, *PLANNING_OVERRIDES]))
    strategy, steps = prepared.strategy, prepared.budget_steps
    return (lambda sigma: strategy.composition(sigma, steps)), prepared.data.task


def calibrate_budget(problem: TotalBudget) -> TotalBudget:
    """Sigma for the problem's target, with the total and per-run epsilons it gives; a refusal's reason instead
    where the runs are refused or no sigma reaches the total."""
    try:
        trial_for, task = composition_for(problem.inputs[0])
        final_for, _ = composition_for(problem.inputs[1])
    except ConfigurationError as error:
        return replace(problem, reason=str(error))
    bound = score_bound_of(task)
    if task.metric_name == "loss" and bound is not None:
        problem = replace(problem, score_bound=bound)
    elif task.metric_name != "accuracy":
        problem = replace(problem, scored=False)
    procedure = procedure_of(problem)
    try:
        sigma = calibrate_procedure(trial_for, final_for, procedure, problem.target, problem.delta)
    except UnreachableEpsilonError:
        return replace(problem, reason=f"a total epsilon of {problem.target:g} over {problem.trials} trials and "
                                       f"{problem.finals} final runs is unreachable even at the largest noise "
                                       f"multiplier: raise the budget, or run fewer trials or seeds")
    return replace(problem, noise_multiplier=sigma,
                   total=procedure_epsilon(trial_for(sigma), final_for(sigma), procedure, problem.delta),
                   per_run=epsilon(final_for(sigma), problem.delta).epsilon,
                   per_trial=epsilon(trial_for(sigma), problem.delta).epsilon if problem.trials else None)


def procedure_of(problem: TotalBudget) -> Procedure:
    return Procedure(problem.trials, problem.finals, problem.score_noise_multiplier if problem.scored else None)
