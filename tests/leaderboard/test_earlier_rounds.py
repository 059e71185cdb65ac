"""A discarded tuning round (a range moved mid-run) ran on the data and released noisy scores: the report counts it
beside the total of each cell it preceded, from the profile's `earlier_rounds`, which is refused where it would not
attach to a private cell as written."""

import pytest

from dpbench.core.errors import ConfigurationError
from dpbench.leaderboard import load_suite
from dpbench.leaderboard.earlier_rounds import with_earlier_round
from dpbench.leaderboard.report import _earlier_text
from dpbench.leaderboard.summary import Entry
from dpbench.leaderboard.total_budget import TotalBudget, calibrate_budget, composition_for
from dpbench.leaderboard.trial_cells import cell_for, trial_cell
from dpbench.privacy.procedure import Procedure, procedure_epsilon
from tests.helpers.leaderboard_suites import word2vec_totals

JL = ("  jl: {overrides: [privatizer=jl], optimizer: adam,\n"
      "       ladder: {key: privatizer.projections, short: r, values: [2, 10]}}")
EARLIER = "        earlier_rounds: {dpadam: {3: 4}, jl_r10: {8: 2}}\n"


def _suite(tmp_path, earlier=EARLIER):
    path = tmp_path / "suite.yaml"
    path.write_text(word2vec_totals(JL, "dpadam, jl, nonprivate", earlier))
    return load_suite("totals", path)


@pytest.mark.parametrize(("earlier", "message"), [
    ("        earlier_rounds: {jl: {3: 4}}\n", "names 'jl', not one of its private variants"),
    ("        earlier_rounds: {nonprivate: {3: 4}}\n", "names 'nonprivate', not one of its private variants"),
    ("        earlier_rounds: {dpadam: {1: 4}}\n", "names budget 1, not one of"),
    ("        earlier_rounds: {dpadam: {3: 0}}\n", "must be a positive number of trials, got 0"),
    ("        earlier_rounds: {dpadam: {3: 4.5}}\n", "must be a positive number of trials, got 4.5"),
    ("        earlier_rounds: {dpadam: [3, 4]}\n", "must map budgets to trial counts"),
    ("        earlier_round: {dpadam: {3: 4}}\n", r"unknown keys \['earlier_round'\]"),
])
def test_an_earlier_round_that_would_not_attach_to_a_private_cell_is_refused(tmp_path, earlier, message):
    with pytest.raises(ConfigurationError, match=message):
        _suite(tmp_path, earlier)


def test_an_earlier_round_is_refused_in_a_per_run_profile(tmp_path):
    """A per-run profile has no total to count the round in: the report would list its trials and show nothing."""
    path = tmp_path / "suite.yaml"
    path.write_text(word2vec_totals(JL, "dpadam, jl, nonprivate", EARLIER).replace("    budget: total\n", ""))
    with pytest.raises(ConfigurationError, match="earlier_rounds needs `budget: total`"):
        load_suite("totals", path)


def test_the_discarded_round_is_counted_beside_the_cells_it_preceded_only(tmp_path):
    suite = _suite(tmp_path)
    task = suite.tasks[0]
    dpadam = task.methods[0]
    variant = dpadam.variants()[0]
    trial = trial_cell(suite, task, dpadam, variant, 3.0, 0, 0.003, 5.0, 1.0)
    final = cell_for(suite, task, dpadam, variant, "test", 3.0, suite.seeds[0], None, 0.003, 5.0, 1.0)
    budget = calibrate_budget(TotalBudget(3.0, task.delta, 4, len(suite.seeds), 10.0,
                                          [trial.overrides, final.overrides]))
    assert budget.reason is None, budget.reason

    both = with_earlier_round(budget, 4)
    trial_for, _ = composition_for(budget.inputs[0])
    final_for, _ = composition_for(budget.inputs[1])
    sigma = budget.noise_multiplier
    assert both == pytest.approx(procedure_epsilon(trial_for(sigma), final_for(sigma), Procedure(8, 4, 10.0),
                                                   budget.delta))
    assert budget.total < both and with_earlier_round(budget, 1) < both  # more trials, more spent

    entry = Entry("w2v", "dpadam", variant.name, "DP-Adam", 3.0)
    assert _earlier_text(task, entry, budget) == (f"; **at most {both:.2f} with the discarded first round** "
                                                  "(4 trials, up to 2 final runs)")
    elsewhere = Entry("w2v", "dpadam", variant.name, "DP-Adam", 8.0)
    assert _earlier_text(task, elsewhere, budget) == ""  # the round preceded the cells at 3 only
    assert task.earlier_trials("jl_r10", 8.0) == 2 and task.earlier_trials("jl_r2", 8.0) == 0

