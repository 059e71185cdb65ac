"""The leaderboard's protocol: each cell's commit and the refusal to mix privacy code, the Holm-corrected family of
claims, choices made on selection runs, diverged seeds counted, the tie rule, and selection seeds apart from the
evaluation seeds."""

import json
import math
import subprocess
from pathlib import Path

import pytest

from dpbench.core.errors import ConfigurationError
from dpbench.core.results import write_json_atomic
from dpbench.leaderboard import build, load_suite
from dpbench.leaderboard.__main__ import main
from dpbench.leaderboard.cell_order import choose
from dpbench.leaderboard.cells import Cell
from dpbench.leaderboard.claims import winners
from dpbench.leaderboard.compare import FAILS, HOLDS, UNCLEAR
from dpbench.leaderboard.family import Collecting, better_test, holm, judge_all
from dpbench.leaderboard.grid import best_trial
from dpbench.leaderboard.provenance import (
    PRIVACY_PATHS,
    Provenance,
    at_launch,
    check_commits,
    current,
    first_launch,
    of_cell,
    require_one_code,
    same_privacy_code,
)
from dpbench.leaderboard.summary import Entry
from tests.leaderboard.test_leaderboard_tuning import SUITE, Simulated

# --- Holm's correction over the family of claims -------------------------------------------------------------------


def test_holm_rejects_only_what_its_step_down_allows():
    """Sorted 0.01, 0.03, 0.04 against 0.05/3, 0.05/2, 0.05: the first passes, the second (0.03 > 0.025) stops."""
    adjusted = holm([0.01, 0.04, 0.03])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06])
    assert [p <= 0.05 for p in adjusted] == [True, False, False]
    assert holm([0.5, 0.001]) == pytest.approx([0.5, 0.002]) and holm([]) == []


def entry(method: str, values: tuple[float, ...], selection: float | None = None, task: str = "t",
          epsilon: float = 3.0) -> Entry:
    return Entry(task, method, method, method, epsilon, metric="accuracy", by_seed=dict(enumerate(values)),
                 selection=selection)


def test_the_paired_t_test_matches_the_closed_form_at_two_degrees_of_freedom():
    """With 2 degrees of freedom the t tail is 1 - t / sqrt(2 + t^2): differences 0.01, 0.02, 0.03 give t = 2 sqrt 3."""
    test = better_test(entry("a", (0.81, 0.82, 0.83)), entry("b", (0.80, 0.80, 0.80)))
    t = 0.02 / (0.01 / math.sqrt(3))
    assert test.p_value == pytest.approx(1 - t / math.sqrt(2 + t * t))


def _claims(*tests):
    """Verdicts of these tests decided as one family."""
    return judge_all(lambda judge: [judge.verdict(test) for test in tests])[0]


def test_a_claim_that_holds_alone_is_not_distinguishable_in_a_family_of_claims():
    base = entry("dpsgd", (0.80, 0.80, 0.80, 0.80, 0.80))
    clear = better_test(entry("d2p2", (0.815, 0.82, 0.825, 0.81, 0.83)), base)  # p about 0.005
    borderline = better_test(entry("jl", (0.81, 0.805, 0.82, 0.80, 0.815)), base)  # p about 0.047
    noise = [better_test(entry(f"m{i}", (0.79, 0.83, 0.80, 0.78, 0.82)), base) for i in range(3)]
    assert 0.05 / 4 < borderline.p_value < 0.05 and clear.p_value < 0.05 / 5
    assert _claims(borderline) == [HOLDS]  # alone: its 95% interval excludes 0
    assert _claims(clear, borderline, *noise) == [HOLDS, UNCLEAR, UNCLEAR, UNCLEAR, UNCLEAR]  # five claims: not
    worse = better_test(base, entry("d2p2", (0.815, 0.82, 0.825, 0.81, 0.83)))
    assert _claims(worse) == [FAILS]  # rejected on the other side


def test_a_verdict_of_a_claim_left_out_of_the_family_is_refused():
    base = entry("dpsgd", (0.80, 0.81, 0.80))
    collected, other = better_test(entry("a", (0.9, 0.91, 0.9)), base), better_test(entry("b", (0.7, 0.7, 0.71)), base)
    collecting = Collecting()
    collecting.verdict(collected)
    family = collecting.corrected()
    assert family.verdict(collected) == HOLDS
    with pytest.raises(KeyError, match="not collected into the family"):
        family.verdict(other)


def test_the_best_method_is_chosen_on_its_selection_runs_not_on_the_seeds_that_test_it():
    """DP-Adam's evaluation seeds happen to be higher, but D2P2's selection run was: D2P2 is the one judged."""
    table = [entry("dpsgd", (0.80, 0.81, 0.82), selection=0.80), entry("dpadam", (0.86, 0.87, 0.88), selection=0.79),
             entry("d2p2", (0.83, 0.84, 0.85), selection=0.83)]
    (line,) = judge_all(lambda judge: winners(table, (3.0,), None, judge))[0]
    assert line.startswith("epsilon 3: **d2p2** 84.0%") and "chosen on the evaluation seeds" not in line
    assert "over dpsgd" in line  # the baseline too: DP-SGD's selection run beat DP-Adam's


class Flattered(Simulated):
    """DP-SGD's evaluation seeds are 5 points above what its selection runs promised; D2P2's selection runs are
    better."""

    def _run(self, cell):
        state = super()._run(cell)
        if cell.phase == "test" and cell.method == "dpsgd":
            path = cell.directory(self.root) / "results.json"
            results = json.loads(path.read_text())
            write_json_atomic(path, {**results, "test_accuracy": results["test_accuracy"] + 0.05})
        return state


def test_the_report_decides_one_family_and_names_the_winner_chosen_on_selection(tmp_path):
    path = tmp_path / "suite.yaml"
    path.write_text(SUITE)
    suite = load_suite("p", path)
    root, docs = tmp_path / "cells", tmp_path / "docs"
    Flattered(suite, root).run()
    markdown = build(suite, root, docs, "pytest").read_text()
    glance = markdown.split("## At a glance")[1].split("## Results per task")[0]
    assert "| CNN (26K) | 3 | D2P2-SGD 77.3% [76.6, 78.0] | DP-SGD | -4.0 points" in glance  # not DP-SGD itself
    assert "| **does not hold**" not in glance and "| does not hold |" in glance
    # D2P2 against DP-SGD at epsilon 1 and 3: stated by the glance, the winners and the D2P2 claim, tested once each.
    assert "one family of 2 tested claims" in markdown
    assert "Holm's step-down method at family-wise alpha 0.05" in markdown
    assert "the smaller learning rate, then the smaller clip norm" in markdown
    assert "Evaluation seeds 0, 1, 2 (none of them a selection seed)" in markdown
    assert "This smoke profile runs 3 evaluation seeds, fewer than the protocol's 5" in markdown


# --- diverged seeds -------------------------------------------------------------------------------------------------


class Diverging(Simulated):
    """D2P2 at epsilon 1: seed 1 ends at the task's chance level, seed 2 with a NaN test loss (a finite accuracy)."""

    def _run(self, cell):
        state = super()._run(cell)
        if cell.phase == "test" and cell.method == "d2p2" and cell.epsilon == 1 and cell.seed in (1, 2):
            path = cell.directory(self.root) / "results.json"
            results = json.loads(path.read_text())
            changed = {"test_accuracy": 0.5} if cell.seed == 1 else {"test_loss": "nan"}
            write_json_atomic(path, {**results, **changed})
        return state


def test_diverged_seeds_are_counted_in_their_cell_and_stay_in_its_mean(tmp_path):
    path = tmp_path / "suite.yaml"
    chance = "    validation_size: 200\n    chance: 0.5\n    anchors:"
    path.write_text(SUITE.replace("    validation_size: 200\n    anchors:", chance))
    suite = load_suite("p", path)
    root, docs = tmp_path / "cells", tmp_path / "docs"
    Diverging(suite, root).run()
    markdown = build(suite, root, docs, "pytest").read_text()
    (row,) = [line for line in markdown.splitlines() if line.startswith("| D2P2-SGD |")]
    at_one = row.split(" | ")[1]
    assert at_one.startswith("65.5% [") and "(2/3 diverged)" in at_one  # (0.730 + 0.5 + 0.736) / 3: all three kept
    assert "(2/3 diverged)" not in row.split(" | ")[2]
    assert "a seed diverged when its run ended with a non-finite test loss or metric" in markdown


def test_a_seed_without_a_finite_value_is_counted_but_has_nothing_to_average():
    diverged = Entry("t", "d2p2", "d2p2", "D2P2", 1.0, metric="accuracy", by_seed={0: 0.8, 1: 0.11},
                     non_finite={2})
    assert diverged.diverged(0.1) == [1, 2] and diverged.finished == 3 and diverged.mean == pytest.approx(0.455)
    assert diverged.diverged(None) == [2]  # no chance level named: only the non-finite seed


# --- ties in selection ----------------------------------------------------------------------------------------------


def test_equal_validation_values_go_to_the_smaller_learning_rate_then_the_smaller_clip():
    trials = [(2.0, 1.0, 0.8), (1.0, 2.0, 0.8), (4.0, 0.5, 0.7), (1.0, 0.5, 0.8), (0.5, 1.0, None)]
    assert best_trial(trials, maximize=True) == (1.0, 0.5, 0.8)
    assert best_trial([(2.0, None, 3.1), (1.0, None, 3.1), (0.5, None, 3.4)], maximize=False) == (1.0, None, 3.1)
    assert best_trial([(1.0, 1.0, None)], maximize=True) is None


def test_the_scheduler_chooses_the_tied_trial_with_the_smaller_learning_rate(tmp_path):
    """A grid grown downwards lists its new, smaller learning rate last: the tie still goes to it."""
    cells = []
    for trial, lr in enumerate((0.5, 1.0, 0.25)):
        cell = Cell("cnn", "dpsgd", "dpsgd", "DP-SGD", "tune", 1.0, 0, trial, lr, 1.0)
        directory = cell.directory(tmp_path)
        directory.mkdir(parents=True)
        write_json_atomic(directory / "cell.json", cell.__dict__)
        write_json_atomic(directory / "results.json", {"test_metric": "accuracy", "validation_accuracy": 0.9})
        cells.append(cell)
    assert choose(cells, tmp_path).lr == 0.25


# --- selection seeds apart from evaluation seeds --------------------------------------------------------------------


def _profile(tmp_path, seeds: str) -> Path:
    path = tmp_path / "suite.yaml"
    path.write_text(SUITE.replace("    tuning_seed: 3\n    seeds: [0, 1, 2]\n    smoke: true\n", seeds))
    return path


@pytest.mark.parametrize(("seeds", "message"), [
    ("    seeds: [0, 1, 2, 3, 4]\n", "tuning_seed 0 is also an evaluation seed"),
    ("    tuning_seed: 9\n    seeds: [0, 1, 2, 3]\n", "4 evaluation seed\\(s\\), the protocol needs at least 5"),
    ("    tuning_seed: 9\n    seeds: [0, 1, 1, 2, 3]\n", "must be distinct"),
    ("    tuning_seed: 2\n    seeds: [0, 1, 2]\n    smoke: true\n", "tuning_seed 2 is also an evaluation seed"),
])
def test_a_profile_whose_evaluation_seeds_overlap_its_tuning_seed_or_are_too_few_is_refused(tmp_path, seeds, message):
    with pytest.raises(ConfigurationError, match=message):
        load_suite("p", _profile(tmp_path, seeds))


def test_tuning_trials_run_on_the_tuning_seed_and_the_shipped_profiles_keep_them_apart(tmp_path):
    suite = load_suite("p", _profile(tmp_path, "    tuning_seed: 7\n    seeds: [0, 1, 2, 3, 4]\n    smoke: true\n"))
    scheduler = Simulated(suite, tmp_path / "cells")
    scheduler.run_method(suite.tasks[0], suite.tasks[0].methods[1])
    assert {c.seed for c in scheduler.planned if c.phase == "tune"} == {7}
    assert {c.seed for c in scheduler.planned if c.phase == "test"} == {0, 1, 2, 3, 4}
    full, quick = load_suite("full"), load_suite("quick")
    assert len(full.seeds) >= 5 and full.tuning_seed not in full.seeds and not full.smoke
    assert quick.smoke and quick.tuning_seed not in quick.seeds


# --- provenance -----------------------------------------------------------------------------------------------------


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path) -> Path:
    """A git repository with a privacy-relevant file and a README, one commit."""
    root = tmp_path / "repo"
    (root / "dpbench" / "privacy").mkdir(parents=True)
    (root / "dpbench" / "privacy" / "accountant.py").write_text("EPSILON = 1\n")
    (root / "README.md").write_text("dpbench\n")
    _git(root, "init", "-q")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "empty")
    _git(root, "add", ".")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first")
    return root


def _commit(repo: Path, path: str, text: str) -> str:
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text(text)
    _git(repo, "add", path)
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", path)
    return _git(repo, "rev-parse", "HEAD")


def test_the_checkout_s_commit_and_dirty_state(repo):
    head = _git(repo, "rev-parse", "HEAD")
    assert current(repo) == Provenance(head, False)
    (repo / "docs").mkdir()
    (repo / "docs" / "leaderboard.md").write_text("the report's own output\n")
    assert current(repo) == Provenance(head, False)  # docs/ holds what the report writes
    (repo / "dpbench" / "privacy" / "new_mechanism.py").write_text("")
    assert current(repo) == Provenance(head, True)  # an untracked module is code too
    assert current(repo.parent) == Provenance(None, True)  # outside git: unknown, and not clean


def test_commits_differ_only_where_privacy_relevant_code_does(repo):
    first = _git(repo, "rev-parse", "HEAD")
    readme = _commit(repo, "README.md", "dpbench, described better\n")
    accountant = _commit(repo, "dpbench/privacy/accountant.py", "EPSILON = 2\n")
    assert "dpbench/privacy/" in PRIVACY_PATHS
    assert same_privacy_code(first, readme, repo)
    assert not same_privacy_code(readme, accountant, repo)
    assert not same_privacy_code(first, "f" * 40, repo)  # a commit this checkout lacks: fail closed
    cells = [{"commit": first, "dirty": False}, {"commit": readme, "dirty": False}]
    assert not check_commits(cells, repo).mixed
    assert check_commits([*cells, {"commit": accountant, "dirty": False}], repo).mixed
    assert check_commits([{"commit": first, "dirty": True}], repo).mixed  # a dirty tree's edits are recorded nowhere


def test_the_report_says_whether_the_checkout_writing_it_holds_the_cells_privacy_code(repo):
    """Cells of one privacy code reported by a checkout whose privacy code moved on do not measure it: said in bold."""
    first = _git(repo, "rev-parse", "HEAD")
    cells = [{"commit": first, "dirty": False}]
    _commit(repo, "README.md", "dpbench, described better\n")
    check = check_commits(cells, repo)
    assert check.checkout_same and "holds the same privacy-relevant code" in check.report_line()
    (repo / "dpbench" / "privacy" / "accountant.py").write_text("EPSILON = 2\n")  # an edit not committed
    assert not check_commits(cells, repo).checkout_same
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "accountant")
    later = check_commits(cells, repo)
    assert not later.mixed and not later.checkout_same
    assert "**the checkout writing this report" in later.report_line()
    assert "differs from them in privacy-relevant code" in later.report_line()
    assert check_commits([*cells, {"task": "cnn"}], repo).checkout is None  # mixed: no one code to compare


def test_a_cell_recorded_before_cells_kept_their_commit_is_an_unknown_commit(repo):
    assert of_cell({"task": "cnn"}) == Provenance(None, True) and of_cell({"task": "cnn"}).label() == "unknown commit"
    head = _git(repo, "rev-parse", "HEAD")
    with pytest.raises(ConfigurationError) as refused:
        require_one_code([{"commit": head, "dirty": False}, {"task": "cnn"}], Path("cells"), False, repo)
    message = str(refused.value)
    assert "\n" not in message and f"{head[:10]} (1 cell), unknown commit (1 cell)" in message
    assert "--allow-mixed-commits" in message
    allowed = require_one_code([{"commit": head, "dirty": False}, {"task": "cnn"}], Path("cells"), True, repo)
    assert "Mixed commits, allowed by `--allow-mixed-commits`" in allowed.report_line()


def test_a_cell_launched_after_the_tree_changed_counts_as_dirty(monkeypatch):
    """The interpreter and the fork server keep the modules of the code they first imported."""
    states = iter([Provenance("a" * 40, False), Provenance("a" * 40, False), Provenance("b" * 40, False)])
    monkeypatch.setattr("dpbench.leaderboard.provenance.current", lambda: next(states))
    first_launch.cache_clear()
    try:
        assert at_launch() == Provenance("a" * 40, False)
        assert at_launch() == Provenance("b" * 40, True)
    finally:
        first_launch.cache_clear()


class Mixed(Simulated):
    """Cells of two commits that this checkout does not hold (so it cannot tell that their code is the same)."""

    def _run(self, cell):
        state = super()._run(cell)
        path = cell.directory(self.root) / "cell.json"
        commit = ("d" if cell.method == "d2p2" else "e") * 40
        write_json_atomic(path, {**json.loads(path.read_text()), "commit": commit, "dirty": False})
        return state


def test_the_cli_refuses_to_report_mixed_commits_unless_told_and_then_says_so(tmp_path, capsys):
    path = tmp_path / "suite.yaml"
    path.write_text(SUITE)
    root, docs = tmp_path / "cells", tmp_path / "docs"
    Mixed(load_suite("p", path), root).run()
    argv = ["--suite", str(path), "--profile", "p", "--root", str(root), "--docs", str(docs), "--report-only"]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "dddddddddd (" in error and "eeeeeeeeee (" in error
    assert "pass --allow-mixed-commits" in error and not (docs / "leaderboard.md").exists()
    assert main([*argv, "--allow-mixed-commits"]) == 0
    markdown = (docs / "leaderboard.md").read_text()
    assert "**Mixed commits, allowed by `--allow-mixed-commits`**: cells ran at eeeeeeeeee" in markdown
