"""`budget: total`: every method runs the same fixed trials, each private cell's noise is calibrated so that its
trials, their noisy scores and its final runs spend the budget together, and the report shows the total and the
per-run epsilon (and only the noisy scores of the trials)."""

import csv
import json
import threading
import time
from dataclasses import replace

import pytest

from dpbench.core.errors import ConfigurationError
from dpbench.core.results import write_json_atomic
from dpbench.leaderboard import build, load_suite
from dpbench.leaderboard.provenance import Provenance
from dpbench.leaderboard.total_budget import TotalBudget, budget_path, procedure_of, read_budget
from dpbench.privacy.accounting import epsilon
from dpbench.privacy.procedure import calibrate_procedure, procedure_epsilon
from dpbench.privacy.tuning import subsampled_gaussian_run
from tests.leaderboard.test_leaderboard_tuning import CLEAN, SUITE, Simulated, score

TOTAL = SUITE.replace(
    "    tuning: {lr_points: 3, clip_points: 3, max_growth: 16, each_budget: true}\n",
    "    budget: total\n    tuning: {lr_points: 3, clip_points: 3, max_growth: 1, each_budget: true, trials: 5, "
    "score_noise: 20}\n")
VALIDATION = 200


def trial_run(sigma: float):
    return subsampled_gaussian_run(100 / 4800, sigma, 48)


def final_run(sigma: float):
    return subsampled_gaussian_run(100 / 5000, sigma, 50)


class Calibrated(Simulated):
    """The simulated cells, calibrated on a fixed DP-SGD run (no model is planned); JL can reach no total."""

    def _calibrate(self, problem: TotalBudget) -> TotalBudget:
        self.calibrated.append(problem)
        if "privatizer=d2p2" in problem.inputs[0] and problem.target == 1.0:
            return replace(problem, reason="no noise multiplier reaches it")
        procedure = procedure_of(problem)
        sigma = calibrate_procedure(trial_run, final_run, procedure, problem.target, problem.delta)
        return replace(problem, noise_multiplier=sigma,
                       total=procedure_epsilon(trial_run(sigma), final_run(sigma), procedure, problem.delta),
                       per_run=epsilon(final_run(sigma), problem.delta).epsilon,
                       per_trial=epsilon(trial_run(sigma), problem.delta).epsilon)

    def _run(self, cell):
        state = super()._run(cell)
        results = cell.directory(self.root) / "results.json"
        write_json_atomic(results, {**json.loads(results.read_text()), "validation_size": VALIDATION})
        return state


@pytest.fixture(autouse=True)
def one_commit(monkeypatch):
    """The refusals the suite records itself carry the simulated cells' clean commit."""
    monkeypatch.setattr("dpbench.leaderboard.cells.at_launch", lambda: Provenance(CLEAN["commit"], False))


@pytest.fixture
def suite(tmp_path):
    path = tmp_path / "suite.yaml"
    path.write_text(TOTAL)
    return load_suite("p", path)


def _scheduler(suite, root):
    scheduler = Calibrated(suite, root)
    scheduler.calibrated = []
    return scheduler


def test_every_method_runs_the_same_trials_at_every_budget(suite, tmp_path):
    scheduler = _scheduler(suite, tmp_path / "cells")
    scheduler.run()
    refused = [c for c in scheduler.planned if c.variant == "d2p2" and c.epsilon == 1.0]
    assert [(c.phase, c.trial) for c in refused] == [("tune", 0), ("test", None)]  # no total reached: recorded
    trials = [c for c in scheduler.planned if c.phase == "tune" and c.task == "cnn" and c not in refused]
    counts = {}
    for cell in trials:
        counts[(cell.variant, cell.epsilon)] = counts.get((cell.variant, cell.epsilon), 0) + 1
    assert counts == {("nonprivate", None): 5, ("dpsgd", 3.0): 5, ("d2p2", 3.0): 5, ("dpsgd", 1.0): 5}
    points = {budget: {(c.lr, c.clip_norm) for c in trials if c.variant == "dpsgd" and c.epsilon == budget}
              for budget in (1.0, 3.0)}
    assert points[1.0] == points[3.0] == {(c.lr, c.clip_norm) for c in trials if c.variant == "d2p2"}
    assert len(points[1.0]) == 5  # five distinct points of the 3 x 3 grid, never grown
    assert {c.lr for c in trials if c.variant == "nonprivate"} <= {0.5, 0.595, 0.707, 0.841, 1.0, 1.19, 1.41, 1.68,
                                                                  2.0}


def test_each_private_cell_runs_at_the_noise_calibrated_for_its_total(suite, tmp_path):
    scheduler = _scheduler(suite, tmp_path / "cells")
    scheduler.run()
    problem = next(p for p in scheduler.calibrated if p.target == 3.0 and "privatizer=vanilla" in p.inputs[0])
    assert (problem.trials, problem.finals, problem.score_noise_multiplier) == (5, 3, 20.0)
    budget = read_budget(budget_path(tmp_path / "cells", "cnn", "dpsgd", 3.0))
    assert budget.total <= 3.0 and budget.per_run < budget.total
    cells = [c for c in scheduler.planned if c.task == "cnn" and c.variant == "dpsgd" and c.epsilon == 3.0]
    assert len(cells) == 5 + 3
    for cell in cells:
        assert f"privacy.noise_multiplier={budget.noise_multiplier!r}" in cell.overrides
        assert "privacy.epsilon=null" in cell.overrides
    assert len(budget.scores) == 5  # each trial's score released with its noise, and recorded for the report
    exact = {(c.lr, c.clip_norm): score(c) for c in cells if c.phase == "tune"}
    assert all(released != exact[(lr, clip)] for _, lr, clip, released in budget.scores)
    chosen = max(budget.scores, key=lambda row: row[3])
    assert {(c.lr, c.clip_norm) for c in cells if c.phase == "test"} == {(chosen[1], chosen[2])}


def test_a_rerun_reuses_the_recorded_calibration_and_scores(suite, tmp_path):
    first = _scheduler(suite, tmp_path / "cells")
    first.run()
    again = _scheduler(suite, tmp_path / "cells")
    again.run()
    assert again.calibrated == []
    assert [c.overrides for c in again.planned] == [c.overrides for c in first.planned]


def test_the_report_shows_the_total_and_per_run_epsilon_and_only_noisy_scores(suite, tmp_path):
    root, docs = tmp_path / "cells", tmp_path / "docs"
    _scheduler(suite, root).run()
    markdown = build(suite, root, docs, "pytest").read_text()
    budget = read_budget(budget_path(root, "cnn", "dpsgd", 3.0))
    assert (f"total epsilon {budget.total:.2f} (5 trials, 3 final runs), {budget.per_run:.2f} per run"
            in markdown)
    assert "Each budget is a total, tuning included" in markdown and "runs the same 5 trials" in markdown
    assert "refused at epsilon 1 [1]" in markdown and "no noise multiplier reaches it" in markdown
    with (docs / "leaderboard" / "cells.csv").open() as handle:
        rows = [row for row in csv.DictReader(handle) if row["phase"] == "tune" and row["variant"] == "dpsgd"
                and row["target_epsilon"] == "3.0"]
    released = {int(trial): value for trial, _, _, value in budget.scores}
    assert sorted(float(row["validation_value"]) for row in rows) == sorted(released.values())


def test_a_total_that_no_noise_reaches_is_recorded_as_refused(suite, tmp_path):
    root = tmp_path / "cells"
    _scheduler(suite, root).run()
    refused = root / "cnn" / "d2p2" / "tune_eps1_t0" / "refused.json"
    assert json.loads(refused.read_text())["reason"] == "no noise multiplier reaches it"
    overrides = json.loads((refused.parent / "cell.json").read_text())["overrides"]
    assert {"privacy.epsilon=1", "privacy.noise_multiplier=null"} <= set(overrides)  # no calibrated noise


@pytest.mark.parametrize(("edit", "message"), [
    (("trials: 5", "trials: 10"), "tuning.trials must lie in"),
    (("max_growth: 1,", "max_growth: 4,"), "takes max_growth: 1"),
    (("each_budget: true, trials: 5", "each_budget: false"), "each_budget: true"),
    (("    smoke: true\n", ""), "evaluation seed"),
])
def test_a_total_needs_a_fixed_count_at_every_budget(tmp_path, edit, message):
    path = tmp_path / "suite.yaml"
    path.write_text(TOTAL.replace(*edit))
    with pytest.raises(ConfigurationError, match=message):
        load_suite("p", path)


def test_a_headline_profile_must_count_its_tuning_and_the_shipped_one_does(tmp_path):
    path = tmp_path / "suite.yaml"
    path.write_text(SUITE.replace("    tuning_seed: 3\n    seeds: [0, 1, 2]\n    smoke: true\n",
                                  "    tuning_seed: 9\n    seeds: [0, 1, 2, 3, 4]\n").replace("max_growth: 16",
                                                                                               "max_growth: 1"))
    with pytest.raises(ConfigurationError, match="set `budget: total`"):
        load_suite("p", path)
    full = load_suite("full")
    assert full.total and not full.tuning.grows and full.tuning.each_budget
    assert full.trials == full.tuning.lr_points * full.tuning.clip_points or full.tuning.count is not None


def test_a_per_budget_score_noise_reaches_each_budgets_calibration(tmp_path):
    path = tmp_path / "suite.yaml"
    path.write_text(TOTAL.replace("score_noise: 20}", "score_noise: {1: 20, 3: 10}}"))
    scheduler = _scheduler(load_suite("p", path), tmp_path / "cells")
    scheduler.run()
    noises = {(p.target, p.score_noise_multiplier) for p in scheduler.calibrated}
    assert noises == {(1.0, 20.0), (3.0, 10.0)}
    assert read_budget(budget_path(tmp_path / "cells", "cnn", "dpsgd", 3.0)).score_noise_multiplier == 10.0
    path.write_text(TOTAL.replace("score_noise: 20}", "score_noise: {3: 10}}"))
    with pytest.raises(ConfigurationError, match="names no noise for budget 1"):
        load_suite("p", path)


def test_a_dry_run_calibrates_nothing_and_lists_an_uncalibrated_budgets_cells_to_run(suite, tmp_path):
    root = tmp_path / "cells"
    listing = Calibrated(suite, root, dry_run=True)
    listing.calibrated = []
    listing.run()
    assert listing.calibrated == [] and not list(root.glob("**/budget_eps*.json"))
    private = [c for c in listing.planned if c.variant == "dpsgd"]
    assert private and all(f"privacy.epsilon={c.epsilon:g}" in c.overrides for c in private)
    _scheduler(suite, root).run()
    again = Calibrated(suite, root, dry_run=True)
    again.calibrated = []
    again.run()
    budget = read_budget(budget_path(root, "cnn", "dpsgd", 3.0))
    assert again.calibrated == []
    assert any(f"privacy.noise_multiplier={budget.noise_multiplier!r}" in c.overrides for c in again.planned)


class Concurrent(Calibrated):
    """Counts calibrations under way at once (each plans its runs through Hydra's process-wide state)."""

    def _calibrate(self, problem: TotalBudget) -> TotalBudget:
        with self.counting:
            self.active += 1
            self.most = max(self.most, self.active)
        time.sleep(0.05)
        try:
            return super()._calibrate(problem)
        finally:
            with self.counting:
                self.active -= 1


def test_pipelines_run_at_once_calibrate_one_at_a_time(suite, tmp_path):
    scheduler = Concurrent(suite, tmp_path / "cells", jobs=2)
    scheduler.calibrated, scheduler.counting, scheduler.active, scheduler.most = [], threading.Lock(), 0, 0
    scheduler.run()
    assert len(scheduler.calibrated) >= 3 and scheduler.most == 1


def test_an_anchor_read_at_a_total_over_several_runs_says_its_per_run_budget():
    """Tramer & Boneh's 86.0% is one run at epsilon 3; the suite's recipe cell at a total of 3 over 5 seeds runs each
    seed at about 1.24: the anchor line must say so, not compare the two as if alike."""
    from dpbench.leaderboard.report import _anchor_lines
    from dpbench.leaderboard.summary import Entry

    full = load_suite("full")
    (task,) = [t for t in full.tasks if t.name == "fm_cnn_tb"]
    ours = Entry(task.name, "dpsgd", "dpsgd", "DP-SGD", 3.0, metric="accuracy",
                 by_seed={1: 0.838, 2: 0.836, 3: 0.840})
    record = TotalBudget(3.0, 1e-5, 0, 5, 10.0, [[], []], noise_multiplier=2.3, total=3.0, per_run=1.24)
    (line,) = [line for line in _anchor_lines(task, [ours], {(task.name, "dpsgd", 3.0): record}, full)
               if line.startswith("- ")]
    assert "-2.2 points (at a total of epsilon 3 over 5 runs: 1.24 a run, not the paper's one run" in line
    assert line.endswith("`fm_cnn_tb_paper_noise` runs it at the paper's noise, like for like)")
    (scatternet,) = [t for t in full.tasks if t.name == "fm_scatternet_tb"]  # no task at its paper's noise
    (line,) = [line for line in _anchor_lines(scatternet, [ours], {(scatternet.name, "dpsgd", 3.0): record}, full)
               if line.startswith("- ")]
    assert line.endswith("no run here at the paper's own noise)")
    (plain,) = [line for line in _anchor_lines(task, [ours], {}, full) if line.startswith("- ")]
    assert plain.endswith("-2.2 points")  # a per-run cell's epsilon is the paper's: nothing to add
