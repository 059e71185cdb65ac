"""What a discarded tuning round adds to a cell's total: a range moved mid-run (its first round's best points at an
edge) leaves trials that ran on the data, released their noisy scores and informed the move, and whose spend the
cell's calibrated total does not hold. The report shows the composition of both rounds beside the total, from the
cell's own calibration record: the earlier round's trials at the same noise, and as many final runs again as the
cell has (all counted, an upper bound where the earlier round ran fewer), with dpbench's accountant, as every total.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from functools import cache

from dpbench.leaderboard.total_budget import TotalBudget, composition_for, procedure_of
from dpbench.privacy.procedure import procedure_epsilon


def with_earlier_round(budget: TotalBudget, trials: int) -> float:
    """The total epsilon of the cell's procedure and an earlier round of `trials` trials and up to `budget.finals`
    final runs, all at the cell's calibrated noise."""
    return _spent(json.dumps(asdict(budget), sort_keys=True), trials)


@cache
def _spent(record: str, trials: int) -> float:
    """Cached by the calibration record: each planning composes the run through Hydra, a second a run."""
    budget = TotalBudget(**json.loads(record))
    if budget.noise_multiplier is None:
        raise ValueError("a budget without a calibrated noise multiplier has no total to add a round to")
    trial_for, _ = composition_for(budget.inputs[0])
    final_for, _ = composition_for(budget.inputs[1])
    both = procedure_of(replace(budget, trials=budget.trials + trials, finals=2 * budget.finals))
    sigma = budget.noise_multiplier
    return procedure_epsilon(trial_for(sigma), final_for(sigma), both, budget.delta)
