"""`python -m dpbench.leaderboard --private-tuning --plan` on a tiny suite: every private method's epsilon with tuning,
from the compositions its cells would run, and no cell run."""

import json
import re

import pytest

from dpbench.leaderboard.__main__ import main
from dpbench.leaderboard.private_tuning import DEFAULT_SCORE_NOISE, PrivateTuning, plan_rows, run_privacy
from dpbench.leaderboard.suite import load_suite
from dpbench.leaderboard.trial_cells import cell_for, start_grid
from dpbench.privacy.tuning import TrialCount, tuning_epsilon

TINY = """
delta: 1.0e-5
common: [trainer.enable_progress_bar=false, trainer.checkpoint=false, logger.csv=false]
methods:
  nonprivate: {label: non-private, overrides: [privatizer=nonprivate], optimizer: task, private: false}
  dpsgd: {label: DP-SGD, overrides: [privatizer=vanilla], optimizer: sgd}
  jl: {label: JL, overrides: [privatizer=jl, privatizer.projections=10], optimizer: task}
  d2p2: {label: D2P2, overrides: [privatizer=d2p2], optimizer: sgd}
tasks:
  cnn:
    title: tiny CNN
    overrides: [model=cnn, data=mnist5k, batch_size=100, max_steps=30]
    optimizer: sgd
    lr: {sgd: [0.5, 2.0]}
    clip: [0.5, 2.0]
    validation_size: 400
profiles:
  run:
    budgets: [1]
    tune_epsilon: 1
    tuning: {lr_points: 2, clip_points: 2, max_growth: 1, each_budget: true}
    tuning_seed: 100
    seeds: [0]
    smoke: true
    tasks:
      cnn: {methods: [dpsgd], overrides: [max_steps=4, profiler.warmup_steps=1]}
  tiny:
    budgets: [1, 3]
    tune_epsilon: 3
    tuning: {lr_points: 2, clip_points: 2, max_growth: 1, each_budget: false}
    tuning_seed: 100
    seeds: [0]
    smoke: true
    tasks:
      cnn: {methods: [nonprivate, dpsgd, jl]}
  projected:
    budgets: [3]
    tune_epsilon: 3
    tuning: {lr_points: 2, clip_points: 2, max_growth: 1, each_budget: false}
    tuning_seed: 100
    seeds: [0]
    smoke: true
    tasks:
      cnn: {methods: [d2p2], overrides: [max_steps=5]}  # a step's own noise each: 30 took 55 s to plan
"""


@pytest.fixture
def suite_file(tmp_path):
    path = tmp_path / "suite.yaml"
    path.write_text(TINY)
    return path


def test_plan_prints_each_private_method_per_run_and_with_tuning_and_runs_no_cell(suite_file, tmp_path, capsys):
    root = tmp_path / "root"
    assert main(["--private-tuning", "--plan", "--suite", str(suite_file), "--profile", "tiny", "--root",
                 str(root)]) == 0
    out = capsys.readouterr().out
    assert not root.exists()
    assert "trials ~ geometric, mean 4" in out  # the profile's trials are the default mean
    assert "non-private" not in out
    lines = {budget: line for line in out.splitlines()
             for budget in ("1", "3") if line.startswith(f"cnn / DP-SGD at epsilon {budget}:")}
    figures = {}
    for budget, line in lines.items():
        match = re.search(r"epsilon ([\d.]+) per run, ([\d.]+) with tuning and 1 final run\(s\) "
                          r"\(RDP: ([\d.]+) per run, ([\d.]+) the "
                          r"tuning alone; delta 1e-05; validation score noise std ([\d.]+)\)", line)
        assert match, line
        figures[budget] = [float(value) for value in match.groups()]
    for budget in ("1", "3"):
        per_run, with_tuning, rdp_per_run, tuning, score_std = figures[budget]
        assert per_run == pytest.approx(float(budget), abs=0.015)  # calibrated to the budget (PRV)
        assert rdp_per_run >= per_run  # RDP never below the PRV figure of the same run
        assert max(tuning, rdp_per_run) < with_tuning < tuning + rdp_per_run
        assert score_std == pytest.approx(DEFAULT_SCORE_NOISE / 400)
    assert figures["1"][3] == figures["3"][3]  # the same tuning (at epsilon 3) before each budget's final run
    # JL at r = 10: its chi-square scale near 0 leaves no finite Renyi bound; D2P2's projection is accounted, its
    # scale tail charged to delta
    jl = [line for line in out.splitlines() if line.startswith("cnn / JL")]
    assert len(jl) == 2 and all(line.startswith(f"cnn / JL at epsilon {budget}: epsilon {budget}.00 per run; private "
                                                "tuning not accounted: its Renyi DP bound gives no finite epsilon")
                                for line, budget in zip(jl, ("1", "3"), strict=True))
    assert main(["--private-tuning", "--plan", "--suite", str(suite_file), "--profile", "projected"]) == 0
    [d2p2] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("cnn / D2P2")]
    match = re.search(r"epsilon ([\d.]+) per run, ([\d.]+) with tuning .* each random-sensitivity step's scale "
                      r"tail of mass ([\d.e-]+) left out of its RDP and charged to delta\)", d2p2)
    assert match, d2p2
    per_run, with_tuning, tail = (float(value) for value in match.groups())
    assert per_run == pytest.approx(3, abs=0.015) and per_run < with_tuning and 0 < tail < 1e-5


def test_the_trial_is_the_tuning_cells_run_and_the_final_run_the_test_cells(suite_file):
    suite = load_suite("tiny", suite_file)
    task = suite.tasks[0]
    method = next(m for m in task.methods if m.name == "dpsgd")
    variant, (lr, clip) = method.variants()[0], start_grid(suite, task, method).points()[0]
    trial = run_privacy(cell_for(suite, task, method, variant, "tune", 3, 0, 0, lr, clip).overrides)
    final = run_privacy(cell_for(suite, task, method, variant, "test", 1, 0, None, lr, clip).overrides)
    [(trial_step, trial_steps)], [(final_step, final_steps)] = trial.composition, final.composition
    assert trial_step.sampling_rate == pytest.approx(100 / 3600)  # 4,000 training examples less 400 for validation
    assert final_step.sampling_rate == pytest.approx(100 / 4000)
    assert trial_steps == final_steps == 30 and trial.examples == 400
    assert trial.epsilon == pytest.approx(3, abs=0.01) and final.epsilon == pytest.approx(1, abs=0.01)
    rows = [row for row in plan_rows(suite, PrivateTuning(TrialCount(4, 1))) if row.label == "DP-SGD"]
    assert [row.budget for row in rows] == [1.0, 3.0]
    assert rows[0].accounted == tuning_epsilon(trial.composition, final.composition, TrialCount(4, 1), 1e-5,
                                               DEFAULT_SCORE_NOISE)
    longer = [row for row in plan_rows(suite, PrivateTuning(TrialCount(40, 1))) if row.label == "DP-SGD"]
    assert all(long.accounted.with_tuning > short.accounted.with_tuning
               for long, short in zip(longer, rows, strict=True))


@pytest.mark.parametrize("argv, message", [
    (["--plan"], "--plan goes with --private-tuning"),
    (["--private-tuning", "--plan", "--tuning-mean", "0"], "mean number of tuning trials"),
    (["--private-tuning", "--plan", "--tuning-shape", "-1"], "shape of the number of tuning trials"),
    (["--private-tuning", "--plan", "--score-noise", "0"], "--score-noise"),
])
def test_bad_private_tuning_options_are_refused_in_one_line(suite_file, capsys, argv, message):
    assert main([*argv, "--suite", str(suite_file), "--profile", "tiny"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_private_tuning_runs_a_secret_number_of_trials_and_reports_its_epsilon_beside_the_run_s(suite_file, tmp_path,
                                                                                                 clean_commit):
    """Through the real CLI: K trials drawn from the suite's secret (the same K when the suite resumes), the winner by
    noisy score trains the test cell, and the epsilon with tuning is dp-accounting's composition of the trial and
    the final run as their cells run them."""
    root, docs = tmp_path / "root", tmp_path / "docs"
    argv = ["--private-tuning", "--tuning-mean", "3", "--suite", str(suite_file), "--profile", "run", "--root",
            str(root), "--docs", str(docs), "--launcher", "subprocess"]
    assert main(argv) == 0
    secret = root / ".tuning_secret"
    assert secret.stat().st_mode & 0o077 == 0  # the owner's only
    tunes = sorted((root / "cnn" / "dpsgd").glob("tune_eps1_t*"), key=lambda path: int(path.name.rsplit("t", 1)[1]))
    assert tunes and [t.name for t in tunes] == [f"tune_eps1_t{k}" for k in range(len(tunes))]
    selection = json.loads((root / "cnn" / "dpsgd" / "selection_eps1.json").read_text())
    final = json.loads((root / "cnn" / "dpsgd" / "eps1_s0" / "cell.json").read_text())
    assert (final["lr"], final["clip_norm"]) == (selection["lr"], selection["clip_norm"])
    winner = next(json.loads((t / "cell.json").read_text()) for t in tunes
                  if (json.loads((t / "cell.json").read_text())["lr"], json.loads((t / "cell.json").read_text())[
                      "clip_norm"]) == (selection["lr"], selection["clip_norm"]))
    trial, run = run_privacy(winner["overrides"]), run_privacy(final["overrides"])
    expected = tuning_epsilon(trial.composition, run.composition, TrialCount(3, 1), 1e-5, DEFAULT_SCORE_NOISE)
    assert selection["with_tuning"] == pytest.approx(expected.with_tuning)
    assert selection["with_tuning"] > selection["per_run"] == pytest.approx(1, abs=0.01)
    markdown = (docs / "leaderboard.md").read_text()
    assert f"epsilon {selection['per_run']:.2f} per run, {selection['with_tuning']:.2f} with tuning" in markdown
    assert "tuned privately (geometric number of trials, mean 3" in markdown
    assert secret.read_text() not in markdown and "trials (" not in markdown  # neither the secret nor K is shown

    assert main(argv) == 0  # resumed: the same secret, so the same K, and no cell runs again
    assert sorted((root / "cnn" / "dpsgd").glob("tune_eps1_t*"), key=lambda path: int(path.name.rsplit("t", 1)[1])) \
        == tunes
