"""The suite's tasks say what a reader needs to judge them (issue 50): each classification task's chance level, what
was cut from a paper's setting the machine cannot run (printed beside every claim judged on it), and the published
anchor at the paper's own noise, accounted by dpbench's and dp-accounting's accountants alike."""

from __future__ import annotations

import re

import pytest
from omegaconf import OmegaConf

from dpbench.leaderboard.accountants import accountant_lines
from dpbench.leaderboard.cells import Outcome
from dpbench.leaderboard.report import _claim_title
from dpbench.leaderboard.suite import default_suite_path, load_suite
from dpbench.leaderboard.trial_cells import cell_for

TB_Q, TB_STEPS = 2048 / 60000, 40 * round(60000 / 2048)


@pytest.fixture(scope="module")
def tasks():
    return {task.name: task for task in load_suite("full").tasks}


def test_every_classification_task_names_its_chance_level(tasks):
    unscored = [name for name, task in tasks.items() if "model=word2vec" not in task.overrides and task.chance is None]
    assert unscored == []
    assert tasks["vit_mnist5k"].chance == 0.116 and tasks["fm_cnn_d2p2paper"].chance == 0.1


def test_a_reduced_paper_setting_is_labelled_beside_its_claims(tasks):
    d2p2 = tasks["fm_cnn_d2p2paper"]
    assert "3 of the paper's 40 epochs" in d2p2.reduced
    assert _claim_title(d2p2) == f"{d2p2.title} (reduced: {d2p2.reduced})"
    assert "Brown" in tasks["word2vec_sgns_sparsepaper"].reduced
    assert _claim_title(tasks["cnn_mnist5k"]) == tasks["cnn_mnist5k"].title


def test_the_tramer_boneh_anchor_also_runs_at_the_papers_noise(tasks):
    raw = OmegaConf.to_container(OmegaConf.load(default_suite_path()))["tasks"]
    assert raw["fm_cnn_tb_paper_noise"]["noise_multiplier"] == 2.15
    assert raw["fm_cnn_tb_paper_noise"]["overrides"] == raw["fm_cnn_tb"]["overrides"]
    assert tasks["fm_cnn_tb"].noise_multiplier is None
    suite = load_suite("full")
    anchor = tasks["fm_cnn_tb_paper_noise"]
    method = next(m for m in anchor.methods if m.name == "dpsgd")
    cell = cell_for(suite, anchor, method, method.variants()[0], "test", 3.0, 1, None, 4.0, 0.1,
                    noise_multiplier=0.9)  # a total budget's calibration must not replace the paper's noise
    assert "privacy.noise_multiplier=2.15" in cell.overrides and "privacy.epsilon=null" in cell.overrides


def _cell(tmp_path, task: str, privatizer: str, sigma: float, spent: float) -> Outcome:
    results = {"private": True, "privatizer": privatizer, "sampling": "poisson", "noise_multiplier": sigma,
               "sampling_rate": TB_Q, "steps": TB_STEPS, "delta": 1e-5, "epsilon": spent}
    return Outcome({"task": task, "method": "dpsgd", "label": "DP-SGD", "phase": "test"}, "done", results, None,
                   tmp_path)


def test_an_anchors_runs_are_accounted_by_both_accountants(tmp_path, tasks):
    task = tasks["fm_cnn_tb"]
    outcomes = [_cell(tmp_path, task.name, "vanilla", 2.15, 2.385), _cell(tmp_path, task.name, "d2p2", 5.0, 3.0),
                _cell(tmp_path, "other", "vanilla", 1.0, 8.0)]
    title, blank, line, end = accountant_lines(task, outcomes)
    assert line.startswith(f"- DP-SGD at noise multiplier 2.15 (sampling rate 0.03413, {TB_STEPS:,} steps, delta 1e-05)"
                           ": epsilon 2.385 by dpbench's PRV accountant, 2.376 by dp-accounting's PLD, 2.59")
    spent, pld, rdp = (float(value) for value in re.findall(r"([\d.]+) by ", line))
    assert spent == 2.385 and pld == pytest.approx(2.376, abs=0.001) and rdp > pld
    assert accountant_lines(tasks["cnn_mnist5k"], outcomes) == []  # no published anchor


def test_a_run_at_the_papers_noise_is_shown_at_what_it_spends_not_at_its_listed_budget(tasks):
    """fm_cnn_tb_paper_noise is listed under epsilon 3, yet each run at noise 2.15 spends 2.39 (PRV), and its five
    runs together more: its table, glance row and figures must not present it as a total of 3."""
    from dpbench.leaderboard.paper_noise import cell_note, column, glance_budget, placed
    from dpbench.leaderboard.summary import Entry

    paper, recipe = tasks["fm_cnn_tb_paper_noise"], tasks["fm_cnn_tb"]
    ours = Entry(paper.name, "dpsgd", "dpsgd", "DP-SGD", 3.0, metric="accuracy", by_seed={1: 0.86, 2: 0.861},
                 spent=[2.386, 2.386])
    assert column(paper, 3.0) == "the paper's noise 2.15" and column(recipe, 3.0) == "epsilon 3"
    assert glance_budget(paper, ours) == "the paper's noise 2.15 (2.39 a run)" and glance_budget(recipe, ours) == "3"
    assert cell_note(paper, ours) == ("; at the paper's noise 2.15: epsilon 2.39 per run, its 2 runs not composed "
                                      "into a total")
    assert cell_note(recipe, ours) == ""
    (drawn,) = placed(paper, [ours])
    assert drawn.epsilon == 2.386 and ours.epsilon == 3.0 and placed(recipe, [ours]) == [ours]
