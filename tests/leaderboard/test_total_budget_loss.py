"""`budget: total` on a task scored by a loss: word2vec releases each trial's validation loss capped at its bound B
(noise std z B/n), the total accounts that Gaussian as it does accuracy's, and the smallest noisy loss is chosen; a
loss task with no bound (a plugin's) keeps its selection unaccounted."""

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from dpbench.core.results import write_json_atomic
from dpbench.core.tasks import NegativeSamplingTask
from dpbench.leaderboard import load_suite
from dpbench.leaderboard.cell_order import FIXED_COUNT_SCORES, _score_key
from dpbench.leaderboard.private_selection import suite_randomness
from dpbench.leaderboard.provenance import Provenance
from dpbench.leaderboard.total_budget import (
    TotalBudget,
    budget_path,
    calibrate_budget,
    composition_for,
    procedure_of,
    read_budget,
)
from dpbench.privacy.accounting import epsilon
from dpbench.privacy.procedure import Procedure, calibrate_procedure, procedure_epsilon
from dpbench.privacy.tuning import subsampled_gaussian_run
from dpbench.privacy.tuning_draws import SCORE
from tests.leaderboard.test_leaderboard_tuning import CLEAN, SUITE, Simulated, score

BOUND = NegativeSamplingTask.score_bound
VALIDATION = 200
TOTAL = SUITE.replace(
    "    tuning: {lr_points: 3, clip_points: 3, max_growth: 16, each_budget: true}\n",
    "    budget: total\n    tuning: {lr_points: 3, clip_points: 3, max_growth: 1, each_budget: true, trials: 5, "
    "score_noise: 20}\n")
WORD2VEC = ["model=word2vec", "data=bbc_news", "model.init_std=1.0", "data.train_size=1000", "optimizer=adam",
            "batch_size=100", "max_steps=20", "privatizer=vanilla", "privacy.epsilon=null",
            "privacy.noise_multiplier=1.0", "privacy.delta=1e-6", "privacy.clip_norm=1.0"]


def trial_run(sigma: float):
    return subsampled_gaussian_run(100 / 4800, sigma, 48)


def final_run(sigma: float):
    return subsampled_gaussian_run(100 / 5000, sigma, 50)


def test_a_word2vec_total_accounts_its_capped_loss_gaussian():
    problem = TotalBudget(3.0, 1e-6, 4, 2, 20.0, [[*WORD2VEC, f"++data.validation_size={VALIDATION}"], WORD2VEC])
    budget = calibrate_budget(problem)
    assert budget.reason is None and budget.scored and budget.score_bound == BOUND
    trial_for, _ = composition_for(problem.inputs[0])
    final_for, _ = composition_for(problem.inputs[1])
    sigma = budget.noise_multiplier
    with_scores = procedure_epsilon(trial_for(sigma), final_for(sigma), procedure_of(budget), problem.delta)
    without = procedure_epsilon(trial_for(sigma), final_for(sigma), Procedure(4, 2, None), problem.delta)
    assert budget.total == with_scores and without < with_scores <= 3.0


def test_a_loss_task_without_a_bound_keeps_its_selection_unaccounted(monkeypatch):
    plugin = SimpleNamespace(metric_name="loss")  # a plugin's task written before Task.score_bound
    monkeypatch.setattr("dpbench.leaderboard.total_budget.composition_for",
                        lambda overrides: (trial_run if "tune" in overrides else final_run, plugin))
    budget = calibrate_budget(TotalBudget(3.0, 1e-5, 5, 3, 20.0, [["tune"], ["final"]]))
    assert not budget.scored and budget.score_bound is None
    assert budget.total == procedure_epsilon(trial_run(budget.noise_multiplier), final_run(budget.noise_multiplier),
                                             Procedure(5, 3, None), 1e-5)


def capped(cell) -> float:
    """The simulated trial's validation loss capped at B: lowest where `score` is highest."""
    return 10.0 * (1.0 - score(cell))


class LossCells(Simulated):
    """Simulated cells of a loss task calibrated as calibrate_budget calibrates word2vec (scored, with its bound);
    each trial's exact loss lies far from its capped one, so a choice on the wrong figure shows."""

    def _calibrate(self, problem: TotalBudget) -> TotalBudget:
        procedure = procedure_of(problem)
        sigma = calibrate_procedure(trial_run, final_run, procedure, problem.target, problem.delta)
        return replace(problem, score_bound=BOUND, noise_multiplier=sigma,
                       total=procedure_epsilon(trial_run(sigma), final_run(sigma), procedure, problem.delta),
                       per_run=epsilon(final_run(sigma), problem.delta).epsilon)

    def _run(self, cell):
        state = super()._run(cell)
        path = cell.directory(self.root) / "results.json"
        results = {key: value for key, value in json.loads(path.read_text()).items() if "accuracy" not in key}
        split = "validation" if cell.phase == "tune" else "test"
        results |= {"test_metric": "loss", f"{split}_loss": capped(cell) + 100.0, "validation_size": VALIDATION}
        if cell.phase == "tune":
            results |= {"validation_capped_loss": capped(cell), "score_bound": BOUND}
        write_json_atomic(path, results)
        return state


@pytest.fixture(autouse=True)
def one_commit(monkeypatch):
    monkeypatch.setattr("dpbench.leaderboard.cells.at_launch", lambda: Provenance(CLEAN["commit"], False))


def test_a_loss_task_releases_its_noisy_capped_loss_and_the_smallest_wins(tmp_path):
    path = tmp_path / "suite.yaml"
    path.write_text(TOTAL)
    suite = load_suite("p", path)
    root = tmp_path / "cells"
    scheduler = LossCells(suite, root)
    task = suite.tasks[0]
    method = next(m for m in task.methods if m.name == "dpsgd")
    variant = method.variants()[0]
    scheduler.run_method(task, method)
    budget = read_budget(budget_path(root, task.name, "dpsgd", 3.0))
    trials = {c.trial: c for c in scheduler.planned if c.phase == "tune" and c.epsilon == 3.0}
    assert budget.scored and len(budget.scores) == len(trials) == 5
    randomness = suite_randomness(root)
    for trial, _, _, released in budget.scores:
        noise = randomness.draws("tuning", SCORE, trial, FIXED_COUNT_SCORES, _score_key(task, variant, 3.0))
        std = budget.score_noise_multiplier * BOUND / VALIDATION  # z B / n: 3.0 here
        expected = capped(trials[trial]) + std * float(noise.normal((1,), torch.float64)[0])
        assert released == pytest.approx(expected, abs=1e-9)
    chosen = min(budget.scores, key=lambda row: row[3])
    assert chosen != max(budget.scores, key=lambda row: row[3])
    tests = {(c.lr, c.clip_norm) for c in scheduler.planned if c.phase == "test" and c.epsilon == 3.0}
    assert tests == {(chosen[1], chosen[2])}
