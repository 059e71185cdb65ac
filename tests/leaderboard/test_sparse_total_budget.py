"""sparse under `budget: total`: no run has an epsilon of its own to take the selection's share of, so the selection
budget comes from the profile task's `at_budget` (a per-run selection epsilon per budget), and the total calibrated
for the cells then spends the selection, the Gaussian noise and the noisy scores together; without it the method is
refused with the privatizer's reason, never run with an unaccounted selection."""

from dataclasses import asdict

import pytest

from dpbench.core.errors import ConfigurationError
from dpbench.leaderboard import load_suite
from dpbench.leaderboard.cells import read_outcome, run_cell
from dpbench.leaderboard.report import _at_budget_lines, _planned
from dpbench.leaderboard.total_budget import TotalBudget, calibrate_budget, composition_for, procedure_of
from dpbench.leaderboard.trial_cells import cell_for, trial_cell
from dpbench.privacy.accounting import epsilon
from dpbench.privacy.mechanisms import SubsampledGaussian
from dpbench.privacy.procedure import Procedure, procedure_epsilon
from dpbench.privacy.sparse_step_accounting import SubsampledSelectionGaussian
from tests.helpers.leaderboard_suites import word2vec_totals

SPARSE = "  sparse: {overrides: [privatizer=sparse, privatizer.sparsity=0.001, privatizer.clip2=10.0], optimizer: adam}"
SELECTION = "        at_budget: {sparse: {3: [privatizer.selection_epsilon=0.2]}}\n"


def _suite(tmp_path, at_budget=SELECTION, edit=("", "")):
    path = tmp_path / "suite.yaml"
    path.write_text(word2vec_totals(SPARSE, "dpadam, sparse, nonprivate", at_budget).replace(*edit))
    return load_suite("totals", path)


def _problem(suite, budget):
    task = suite.tasks[0]
    method = next(m for m in task.methods if m.name == "sparse")
    variant = method.variants()[0]
    trial = trial_cell(suite, task, method, variant, budget, 0, 0.003, 5.0, 1.0)
    final = cell_for(suite, task, method, variant, "test", budget, suite.seeds[0], None, 0.003, 5.0, 1.0)
    return TotalBudget(budget, task.delta, 4, len(suite.seeds), 10.0, [trial.overrides, final.overrides])


def test_the_budgets_selection_epsilon_reaches_that_budgets_cells_only(tmp_path):
    suite = _suite(tmp_path)
    task = suite.tasks[0]
    dpadam, sparse, _ = task.methods
    at = {(method.name, budget): cell_for(suite, task, method, method.variants()[0], "test", budget, 1, None, 0.01,
                                          1.0, 1.0).overrides for method in (dpadam, sparse) for budget in (3.0, 8.0)}
    assert "privatizer.selection_epsilon=0.2" in at["sparse", 3.0]
    assert [item for item in at["sparse", 3.0] if item != "privatizer.selection_epsilon=0.2"] == at["sparse", 8.0]
    assert not any("selection_epsilon" in item for item in at["dpadam", 3.0] + at["sparse", 8.0])


def test_the_total_spends_the_selection_with_the_noise_and_without_it_the_method_is_refused(tmp_path):
    suite = _suite(tmp_path)
    budget = calibrate_budget(_problem(suite, 3.0))
    assert budget.reason is None, budget.reason
    trial_for, _ = composition_for(budget.inputs[0])
    final_for, _ = composition_for(budget.inputs[1])
    sigma = budget.noise_multiplier
    (mechanism, steps), = trial_for(sigma)
    assert isinstance(mechanism, SubsampledSelectionGaussian) and mechanism.draw_epsilon > 0 and mechanism.draws > 0
    assert budget.total == procedure_epsilon(trial_for(sigma), final_for(sigma), procedure_of(budget), budget.delta)
    assert 0.95 * 3.0 <= budget.total <= 3.0
    selection = SubsampledSelectionGaussian(mechanism.sampling_rate, None, mechanism.draw_epsilon, mechanism.draws)
    selection_only = [(selection, steps)]
    spent = procedure_epsilon(selection_only, selection_only, Procedure(4, 2, None), budget.delta)
    assert 0 < spent < budget.total  # the selection is inside the total, and leaves the noise a share

    refused = calibrate_budget(_problem(suite, 8.0))  # no selection budget named at 8
    assert refused.noise_multiplier is None and "privatizer=sparse needs a selection budget" in refused.reason


PER_RUN = ("    budget: total\n    tuning: {lr_points: 2, clip_points: 2, max_growth: 1, each_budget: true, trials: 4, "
           "score_noise: 10}\n", "    tuning: {lr_points: 2, clip_points: 2, max_growth: 1, each_budget: false}\n")


@pytest.mark.parametrize(("at_budget", "edit", "message"), [
    (SELECTION.replace("sparse", "sparce"), ("", ""), "names 'sparce', not one of its"),
    ("        at_budget: {sparse: {1: [privatizer.selection_epsilon=0.2]}}\n", ("", ""), "names budget 1, not one of"),
    ("        at_budget: {nonprivate: {3: [model.init_std=0.5]}}\n", ("", ""), "a non-private method"),
    ("        at_budget: {sparse: {3: privatizer.selection_epsilon=0.2}}\n", ("", ""), "must be a list of overrides"),
    ("        at_budget: {sparse: [privatizer.selection_epsilon=0.2]}\n", ("", ""), "must map budgets to lists"),
    (SELECTION, PER_RUN, "needs tuning.each_budget: true"),
    (SELECTION.replace("at_budget", "at_budgets"), ("", ""), r"unknown keys \['at_budgets'\]"),
], ids=["unknown method", "a budget the task does not run", "non-private", "not a list", "not by budget",
        "trials at one budget", "a misspelt key"])
def test_an_at_budget_that_would_not_take_effect_as_written_is_refused(tmp_path, at_budget, edit, message):
    with pytest.raises(ConfigurationError, match=message):
        _suite(tmp_path, at_budget, edit)


def test_the_report_names_each_budgets_setting_under_the_tasks_title(tmp_path):
    assert _at_budget_lines(_suite(tmp_path).tasks[0]) == [
        "Set per budget (the suite file's at_budget, in those cells' overrides): sparse DP-Adam at epsilon 3: "
        "`privatizer.selection_epsilon=0.2`.", ""]
    assert _at_budget_lines(_suite(tmp_path, "").tasks[0]) == []


def test_a_cell_recorded_with_other_settings_than_the_suite_file_gives_is_stale_in_the_report(tmp_path):
    """The suite re-runs a cell whose overrides the suite file changed (cells.recorded); until then the report must
    not show it: an added setting, a removed one, or one at the wrong budget."""
    suite = _suite(tmp_path)
    task = suite.tasks[0]
    sparse = task.methods[1]
    cell = cell_for(suite, task, sparse, sparse.variants()[0], "test", 3.0, 1, None, 0.003, 5.0, 1.9)
    recorded = {**asdict(cell), "commit": "abc"}  # as cells.run_cell writes cell.json
    assert _planned(suite, recorded)
    without = [item for item in cell.overrides if "selection_epsilon" not in item]
    assert not _planned(suite, {**recorded, "overrides": without})
    assert not _planned(suite, {**recorded, "overrides": [*cell.overrides, "model.init_std=0.5"]})
    at_8 = cell_for(suite, task, sparse, sparse.variants()[0], "test", 8.0, 1, None, 0.003, 5.0, 1.9)
    assert _planned(suite, asdict(at_8)) and "privatizer.selection_epsilon=0.2" not in at_8.overrides
    assert not _planned(suite, {**asdict(at_8), "overrides": cell.overrides})


def test_a_sparse_cell_run_through_the_cli_accounts_the_selection_its_total_was_calibrated_for(tmp_path, monkeypatch,
                                                                                                clean_commit):
    """The cell's own run (the suite's launcher: a `python -m dpbench` process) spends what the total's plan of that
    cell composed, selection included: its ledger's epsilon is the planned run's, above the noise's alone."""
    for key, value in {"WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}.items():
        monkeypatch.setenv(key, value)
    suite = _suite(tmp_path)
    task = suite.tasks[0]
    sparse = task.methods[1]
    cell = cell_for(suite, task, sparse, sparse.variants()[0], "test", 3.0, 1, None, 0.003, 5.0, 2.0)
    assert run_cell(cell, tmp_path / "cells") == "done"
    results = read_outcome(cell.directory(tmp_path / "cells")).results
    planned, _ = composition_for(cell.overrides)
    (mechanism, steps), = planned(2.0)
    assert results["steps"] == steps and results["noise_multiplier"] == 2.0
    assert results["epsilon_estimate"] == pytest.approx(epsilon(planned(2.0), task.delta).epsilon_estimate, rel=0.02)
    noise_only = [(SubsampledGaussian(mechanism.sampling_rate, 2.0), steps)]
    assert results["epsilon_estimate"] > 1.02 * epsilon(noise_only, task.delta).epsilon_estimate
