"""The leaderboard's verdicts and winners on hand-built tables whose answer is known: paired over seeds, with the
three verdicts (holds, does not hold, not distinguishable at this budget) decided over the family of claims made."""

import pytest

from dpbench.leaderboard.claims import check_claims, fmt_entry, winners
from dpbench.leaderboard.compare import FAILS, HOLDS, UNCLEAR, paired
from dpbench.leaderboard.family import Test, better_test, close_test, judge_all
from dpbench.leaderboard.summary import Entry

T_975_2 = 4.302652729911275  # Student t, 97.5% quantile, 2 degrees of freedom (tables)


OPTIMIZERS = {"dpsgd": "sgd", "dpadam": "adam", "jl": "sgd", "d2p2": "sgd", "grape": "adam", "sparse": "adam"}
"""The suite's optimizer for each method these tables use (the paper's baseline is the vanilla method with it)."""


def entry(method: str, epsilon: float | None, accuracy: float | None, step_s: float = 0.1, peak_mb: float = 100.0,
          label: str | None = None, refused: str | None = None, jitter: tuple[float, ...] = (-0.01, 0.0, 0.01),
          device: str = "cpu", task: str = "t") -> Entry:
    seeds = {} if accuracy is None else {s: accuracy + d for s, d in enumerate(jitter)}
    return Entry(task=task, method=method, variant=label or method, label=label or method, epsilon=epsilon,
                 metric="accuracy", by_seed=seeds, step_s=[step_s] * len(seeds), peak_mb=[peak_mb] * len(seeds),
                 refused=refused, device=device, optimizer=OPTIMIZERS.get(method))


def claims(tasks: list, budgets: tuple) -> list[str]:
    """check_claims as the report runs it: the family collected, Holm-corrected, then the verdicts written."""
    return judge_all(lambda judge: check_claims(tasks, budgets, judge))[0]


def won(entries: list[Entry], budgets: tuple, chance: float | None = None) -> list[str]:
    return judge_all(lambda judge: winners(entries, budgets, chance, judge))[0]


def alone(test: Test | None) -> str:
    """The verdict of a family of one claim: what its own 95% interval says."""
    return judge_all(lambda judge: judge.verdict(test))[0]


def test_paired_interval_matches_a_hand_computation():
    a = entry("a", 3, 0.0, jitter=(0.80, 0.85, 0.90))
    b = entry("b", 3, 0.0, jitter=(0.79, 0.83, 0.87))
    comparison = paired(a, b)  # differences 0.01, 0.02, 0.03: mean 0.02, sd 0.01
    half = T_975_2 * 0.01 / 3**0.5
    assert comparison.difference == pytest.approx(0.02)
    assert comparison.interval == pytest.approx((0.02 - half, 0.02 + half))
    assert alone(better_test(a, b)) == UNCLEAR  # [-0.005, +0.045] crosses 0
    assert comparison.text() == "+2.0 points [-0.5, +4.5] over 3 paired seeds"
    wide_gap = entry("a", 3, 0.0, jitter=(0.90, 0.91, 0.92))
    assert alone(better_test(wide_gap, b)) == HOLDS and alone(better_test(b, entry("a", 3, 0.95))) == FAILS
    assert alone(close_test(b, entry("a", 3, 0.95), 0.02)) == FAILS  # 12 points worse: not close
    assert alone(close_test(a, b, 0.02)) == HOLDS  # a is no worse than b
    one_seed = better_test(entry("a", 3, 0.9, jitter=(0.0,)), entry("b", 3, 0.5, jitter=(0.0,)))
    assert one_seed.comparison.interval is None and alone(one_seed) == UNCLEAR


def test_the_same_pair_reads_its_p_value_against_each_claims_own_line():
    """"Better" tests a difference of 0, "close" one of -2 points: different p-values, each naming its line."""
    method = entry("jl", 3, 0.0, jitter=(0.81, 0.80, 0.82))
    base = entry("dpsgd", 3, 0.0, jitter=(0.80, 0.80, 0.81))
    better, close = better_test(method, base), close_test(method, base, 0.02)
    family = judge_all(lambda judge: [judge.verdict(better), judge.verdict(close)])[1]
    assert better.p_value > close.p_value  # +0.7 points is nearer 0 than -2 in units of its spread
    assert family.evidence(better) == f", p {better.p_value:.3f}, Holm {family.adjusted[better.key]:.3f}"
    assert family.evidence(close).startswith(f", p {close.p_value:.3f} against -2.0 points, Holm ")


def test_a_loss_is_better_when_lower():
    def loss(method: str, values: tuple[float, ...]) -> Entry:
        return Entry("t", method, method, method, 3, metric="loss", by_seed=dict(enumerate(values)))

    test = better_test(loss("sparse", (7.0, 7.1, 7.2)), loss("dpadam", (8.0, 8.2, 8.1)))
    assert test.comparison.difference > 0 and alone(test) == HOLDS
    assert test.comparison.text().startswith("-1.000 in loss [")  # shown in the loss's own units: lower


def jl_sentence(rungs: list[Entry]) -> str:
    table = [entry("dpsgd", 3, 0.90, step_s=0.4), *rungs]
    (sentence,) = [s for s in claims([("CNN (26K)", table, None)], (3,)) if s.startswith("JL")]
    return sentence


def test_jl_claim_is_judged_on_every_measured_rung_against_the_paper_s_baseline():
    useless_small_r = entry("jl", 3, 0.10, step_s=0.25, label="JL (r=2)")
    usable_r = entry("jl", 3, 0.89, step_s=0.3, label="JL (r=10)")
    sentence = jl_sentence([useless_small_r, usable_r])
    assert "CNN (26K), on CPU, epsilon 3" in sentence  # the scale and the device are in the sentence
    assert ("JL (r=2) 10.0% [7.5, 12.5] (-80.0 points [-80.0, -80.0] over 3 paired seeds, p < 0.001 against -2.0 "
            "points, Holm < 0.001) at 0.62x") in sentence  # "close" is tested against its margin, and says so
    assert sentence.endswith(": holds for JL (r=10) only.")  # the rung that holds is named: r=2 does not
    assert jl_sentence([useless_small_r]).endswith("**does not hold**.")
    slow = entry("jl", 3, 0.90, step_s=0.5, label="JL (r=10)")  # close, and slower: time is judged at scale only
    assert jl_sentence([useless_small_r, slow]).endswith(": holds for JL (r=10) only.")
    assert "at 1.25x its time per step" in jl_sentence([useless_small_r, slow])
    assert jl_sentence([slow]).endswith(": holds.")  # the only rung measured holds: no rung to name
    noisy = entry("jl", 3, 0.88, step_s=0.3, label="JL (r=10)", jitter=(-0.05, 0.0, 0.06))
    assert jl_sentence([noisy]).endswith(": not distinguishable at this budget.")


def test_a_claim_is_judged_against_its_paper_s_baseline_not_the_better_vanilla_method():
    """D2P2 (an SGD method) against DP-SGD even where DP-Adam scores higher: the comparison isolates the method, not
    the optimizer; GRAPE (Adam) against DP-Adam even where DP-SGD scores higher. A task without the paper's baseline
    compares with the other vanilla method and says so."""
    table = [entry("dpsgd", 3, 0.80, label="DP-SGD"), entry("dpadam", 3, 0.90, label="DP-Adam"),
             entry("d2p2", 3, 0.85)]
    (sentence,) = claims([("CNN", table, None)], (3,))
    assert "vs DP-SGD 80.0%" in sentence and sentence.endswith(": holds at epsilon 3.")
    vit = [entry("dpsgd", 3, 0.95, label="DP-SGD"), entry("dpadam", 3, 0.70, label="DP-Adam"),
           entry("grape", 3, 0.69)]
    (grape,) = claims([("ViT", vit, None)], (3,))
    assert "vs DP-Adam 70.0%" in grape and grape.endswith(": holds.")
    without_dpsgd = [entry("dpadam", 3, 0.90, label="DP-Adam"), entry("d2p2", 3, 0.85)]
    (stand_in,) = claims([("MiniLM", without_dpsgd, None)], (3,))
    assert ("vs DP-Adam (the paper's baseline, the vanilla method with this method's optimizer, is not run here) "
            "90.0%") in stand_in
    assert stand_in.endswith("**does not hold** at epsilon 3.")
    pending = entry("dpsgd", 3, None, label="DP-SGD")  # the paper's baseline runs but has no result yet
    assert claims([("CNN", [pending, entry("dpadam", 3, 0.90), entry("d2p2", 3, 0.85)], None)], (3,)) == []
    unknown = entry("d2p2", 3, 0.85)
    unknown.optimizer = None
    (unrecorded,) = claims([("CNN", [entry("dpadam", 3, 0.90, label="DP-Adam"), unknown], None)], (3,))
    assert "vs DP-Adam (this method's optimizer is not recorded: the better vanilla method stands in)" in unrecorded


def test_grape_d2p2_and_sparse_verdicts():
    vit = [entry("dpadam", 3, 0.70, peak_mb=200), entry("grape", 3, 0.69, peak_mb=120)]
    cnn = [entry("dpsgd", 1, 0.80), entry("d2p2", 1, 0.84), entry("dpsgd", 8, 0.92), entry("d2p2", 8, 0.93)]
    cnn_worse = [entry("dpsgd", 1, 0.80, task="t2"), entry("d2p2", 1, 0.75, task="t2"),
                 entry("dpsgd", 8, 0.92, task="t2"), entry("d2p2", 8, 0.93, task="t2")]
    grape, d2p2, d2p2_worse = claims([("ViT", vit, None), ("CNN", cnn, None), ("CNN2", cnn_worse, None)],
                                     (1, 3, 8))
    assert "0.60x its peak memory" in grape and grape.endswith(": holds.")
    assert "memory and speed are judged in Claims at scale" in grape
    assert d2p2.startswith("D2P2") and d2p2.endswith(": holds at epsilon 1; holds at epsilon 8.")
    assert d2p2_worse.endswith("**does not hold** at epsilon 1; holds at epsilon 8.")  # every budget's verdict
    unstable = [entry("dpsgd", 1, 0.70), entry("d2p2", 1, 0.33, jitter=(-0.23, -0.23, 0.46))]
    (sentence,) = claims([("FMNIST", unstable, None)], (1,))  # D2P2 diverged on two seeds of three
    assert sentence.endswith(": not distinguishable at epsilon 1.")
    heavy = claims([("ViT", [entry("dpadam", 3, 0.70, peak_mb=200),
                                   entry("grape", 3, 0.69, peak_mb=190)], None)], (3,))
    assert heavy[0].endswith(": holds.")  # accuracy close: 0.95x CPU memory of a small model is not judged here


def test_winner_and_its_paired_margin_over_the_better_vanilla():
    table = [entry("dpsgd", 3, 0.90), entry("dpadam", 3, 0.92), entry("d2p2", 3, 0.95, label="D2P2-SGD"),
             entry("dpsgd", 8, 0.93), entry("dpadam", 8, 0.94)]
    assert won(table, (3, 8)) == [
        "epsilon 3: **D2P2-SGD** 95.0% [92.5, 97.5] (chosen on the evaluation seeds: no selection score), +3.0 points "
        "[+3.0, +3.0] over 3 paired seeds, p < 0.001, Holm < 0.001 over dpadam (92.0% [89.5, 94.5]): better: holds",
        "epsilon 8: **dpadam** 94.0% [91.5, 96.5] (chosen on the evaluation seeds: no selection score) (vanilla "
        "itself)"]
    recipe = [entry("dpsgd", 3, 0.84)]  # one method, untuned: nothing was chosen, on any seeds
    assert won(recipe, (3,)) == ["epsilon 3: **dpsgd** 84.0% [81.5, 86.5] (vanilla itself)"]


def test_nothing_is_judged_or_crowned_at_a_constant_prediction_s_accuracy():
    """Two methods that both predict the majority class are not "close", and neither wins."""
    table = [entry("dpadam", 3, 0.592, step_s=1.0), entry("jl", 3, 0.592, step_s=0.5, label="JL (r=2)")]
    (sentence,) = claims([("BiLSTM", table, 0.59)], (3,))
    assert sentence == ("JL, epsilon 3, BiLSTM, on CPU: cannot be judged here, no method compared beats a constant "
                        "prediction's 59.0% (dpadam 59.2%, JL (r=2) 59.2%).")
    assert claims([("BiLSTM", table, None)], (3,))[0].endswith(": holds.")
    assert won(table, (3,), 0.59) == [
        "epsilon 3: none, no private method beats a constant prediction (59.0%; best dpadam 59.2%)"]


def test_d2p2_is_judged_only_on_budgets_where_something_learned():
    at_chance_small_eps = [entry("dpsgd", 1, 0.59), entry("d2p2", 1, 0.595), entry("dpsgd", 8, 0.80),
                           entry("d2p2", 8, 0.70)]
    (sentence,) = claims([("BiLSTM", at_chance_small_eps, 0.59)], (1, 8))
    assert "epsilon 1" not in sentence and sentence.endswith("**does not hold** at epsilon 8.")


def test_jl_without_timings_cannot_be_checked():
    untimed = entry("jl", 3, 0.89, label="JL (r=10)")
    untimed.step_s = []
    assert jl_sentence([untimed]).endswith("cannot be checked, no rung recorded its time per step.")


def test_a_paper_setting_s_method_is_judged_under_its_claim(tmp_path):
    """The papers' own settings run D2P2 as `d2p2_paper_p` and sparse as `sparse_paper` (their thresholds); the claims
    section must use those cells (issue 28), found by the privatizer their overrides choose."""
    from dpbench.leaderboard.cells import Outcome
    from dpbench.leaderboard.summary import summarize

    def cell(method: str, label: str, privatizer: str, seed: int, value: float) -> Outcome:
        overrides = ["model=cnn_d2p2", "optimizer=sgd", "privatizer=vanilla", f"privatizer={privatizer}",
                     f"seed={seed}"]
        return Outcome({"task": "paper", "method": method, "variant": method, "label": label, "phase": "test",
                        "epsilon": 1.0, "seed": seed, "lr": 1.0, "clip_norm": 1.0, "overrides": overrides}, "done",
                       {"test_metric": "accuracy", "test_accuracy": value, "device": "cpu", "step_time_s": 0.1},
                       None, tmp_path)

    outcomes = [cell("dpsgd", "DP-SGD", "vanilla", s, 0.58 + 0.01 * s) for s in range(3)]
    outcomes += [cell("d2p2_paper_p", "D2P2-SGD (p = 0.3 d)", "d2p2", s, 0.62 + 0.01 * s) for s in range(3)]
    entries, _ = summarize(outcomes)
    (sentence,) = claims([("its paper's CNN", entries["paper"], None)], (1.0,))
    assert sentence.startswith("D2P2 (better than DP-SGD, especially at small epsilon), its paper's CNN, on CPU: "
                               "D2P2-SGD (p = 0.3 d) at epsilon 1: 63.0%")
    assert "vs DP-SGD 59.0%" in sentence and sentence.endswith(": holds at epsilon 1.")

    def loss(method: str, privatizer: str | None, values: tuple[float, ...]) -> Entry:
        return Entry("t", method, method, method, 3, metric="loss", by_seed=dict(enumerate(values)),
                     privatizer=privatizer, optimizer="adam")

    table = [loss("dpadam", "vanilla", (36.0, 36.1, 36.2)), loss("sparse_paper", "sparse", (36.6, 36.6, 36.7))]
    (sentence,) = claims([("skip-gram pairs", table, None)], (3.0,))
    assert sentence.startswith("sparse (lower word2vec loss than dense DP training), skip-gram pairs, epsilon 3: "
                               "sparse_paper")
    assert " vs dpadam 36.100 [" in sentence and sentence.endswith("**does not hold**.")  # the paper's own baseline


def test_a_task_running_both_a_method_and_its_paper_variant_is_judged_on_the_method():
    both = [entry("dpsgd", 1, 0.60), entry("d2p2_paper_p", 1, 0.70, label="D2P2-SGD (p = 0.3 d)"),
            entry("d2p2", 1, 0.50, label="D2P2-SGD")]
    both[1].privatizer = both[2].privatizer = "d2p2"
    (sentence,) = claims([("CNN", both, None)], (1.0,))
    assert "CNN, on CPU: D2P2-SGD at epsilon 1: 50.0%" in sentence


def test_an_accuracy_interval_stays_within_zero_and_one_in_the_table_and_the_figure():
    """D2P2 on Fashion-MNIST at epsilon 1: 10.0, 10.0 and 79.8% over three seeds; its t interval is [-67, +134]%."""
    from dpbench.leaderboard.plots import _error

    diverged = entry("d2p2", 1, 0.333, jitter=(-0.233, -0.233, 0.465))
    assert diverged.interval == (0.0, 1.0)
    assert fmt_entry(diverged) == "33.3% [0.0, 100.0]"
    below, above = _error([diverged])
    assert below[0] == pytest.approx(diverged.mean) and above[0] == pytest.approx(1.0 - diverged.mean)
    loss = Entry(task="t", method="dpsgd", variant="dpsgd", label="DP-SGD", epsilon=1, metric="loss",
                 by_seed={0: 0.1, 1: 5.0, 2: 0.2})
    assert loss.interval[0] < 0  # a loss's interval is the t interval as it is


def test_a_loss_task_judges_nothing_where_no_method_beats_a_constant_score():
    """word2vec's private runs (7-17) lie above the loss a constant score gets (3.14): a lower loss among them is not
    a method that learned, so neither the sparse claim nor a winner is stated."""

    def loss(method: str, values: tuple[float, ...]) -> Entry:
        return Entry("t", method, method, method, 3, metric="loss", by_seed=dict(enumerate(values)),
                     optimizer=OPTIMIZERS[method])

    table = [loss("dpsgd", (9.2, 9.3, 9.25)), loss("dpadam", (8.0, 8.2, 8.1)), loss("sparse", (17.2, 17.3, 17.1))]
    (sentence,) = claims([("word2vec", table, 3.1395)], (3.0,))
    assert sentence == ("sparse, epsilon 3, word2vec: cannot be judged here, no method compared beats a "
                        "constant prediction's 3.139 (sparse 17.200, dpadam 8.100).")
    assert won(table, (3.0,), 3.1395) == [
        "epsilon 3: none, no private method beats a constant prediction (3.139; best dpadam 8.100)"]
    learning = [loss("dpadam", (3.0, 3.05, 3.1)), loss("sparse", (2.9, 2.95, 3.0))]
    (judged,) = claims([("word2vec", learning, 3.1395)], (3.0,))
    assert judged.startswith("sparse (lower word2vec loss than dense DP training)") and "vs dpadam" in judged


def test_every_claim_is_judged_at_every_budget_its_task_ran():
    """The sparse claim was judged at the suite's tuning budget only: at epsilon 3 no method beat a constant score,
    and epsilon 8's evidence (dense DP-Adam below it, sparse far above) was never tested."""

    def loss(method: str, epsilon: float, values: tuple[float, ...]) -> Entry:
        return Entry("t", method, method, method, epsilon, metric="loss", by_seed=dict(enumerate(values)),
                     optimizer=OPTIMIZERS[method])

    table = [loss("dpadam", 3, (3.18, 3.19, 3.185)), loss("sparse", 3, (3.83, 3.84, 3.835)),
             loss("dpadam", 8, (2.98, 2.97, 2.99)), loss("sparse", 8, (3.51, 3.53, 3.52))]
    at_3, at_8 = claims([("word2vec", table, 3.1395)], (3.0, 8.0))
    assert at_3.startswith("sparse, epsilon 3, word2vec: cannot be judged here")
    assert at_8.startswith("sparse (lower word2vec loss than dense DP training), word2vec, epsilon 8")
    assert at_8.endswith("**does not hold**.")
    vit = [entry("dpadam", 3, 0.70, peak_mb=200), entry("grape", 3, 0.69, peak_mb=120),
           entry("dpadam", 8, 0.80, peak_mb=200), entry("grape", 8, 0.79, peak_mb=120)]
    assert [s.split(": ")[0][-9:] for s in claims([("ViT", vit, None)], (3, 8))] == ["epsilon 3", "epsilon 8"]


def test_word2vec_chance_is_the_best_constant_score_s_loss():
    """The suite's word2vec `chance` is what the task's own loss gives a model that scores every pair alike, at the
    best such score (one positive, the data's 8 negatives)."""
    import torch
    from omegaconf import OmegaConf
    from scipy.optimize import minimize_scalar

    from dpbench.core.tasks import NegativeSamplingTask
    from dpbench.leaderboard.suite import load_suite
    from tests.helpers.cli import ROOT

    negatives = OmegaConf.load(ROOT / "conf" / "data" / "bbc_news.yaml").negatives
    task = NegativeSamplingTask()

    def constant(score: float) -> float:
        scores = (torch.full((1, 1), score, dtype=torch.float64), torch.full((1, negatives), score,
                                                                              dtype=torch.float64))
        return float(task.per_sample_loss(lambda _: scores, (None,)))

    best = minimize_scalar(constant, bounds=(-10, 10), method="bounded")
    suite = load_suite("full")
    for name in ("word2vec_bbc_news", "word2vec_sgns_sparsepaper"):
        (chance,) = [t.chance for t in suite.tasks if t.name == name]
        assert chance == pytest.approx(best.fun, abs=1e-4), name


def test_a_comparison_with_a_method_tuned_on_its_grid_s_edge_says_so():
    """The first review's only "holds" was won against a baseline whose search ended at its range's limit: a better
    point may lie outside it, and the sentence must say that beside the verdict."""
    base = entry("dpadam", 3, 0.70, label="DP-Adam")
    base.on_edge = True
    grape = entry("grape", 3, 0.69)
    (sentence,) = claims([("ViT", [base, grape], None)], (3,))
    assert "vs DP-Adam (tuned on its grid's edge) 70.0%" in sentence
    grape.on_edge, base.on_edge = True, False
    (sentence,) = claims([("ViT", [base, grape], None)], (3,))
    assert "69.0% [66.5, 71.5] (tuned on its grid's edge) vs DP-Adam 70.0%" in sentence


def test_a_claim_names_the_seeds_that_diverged_beside_the_mean():
    """D2P2 on its paper's CNN at epsilon 1 ended at chance on every seed: its verdict said 'does not hold' beside a
    mean of 10.2% without saying that its runs diverged."""
    table = [entry("dpsgd", 1, 0.66), entry("d2p2", 1, 0.10, jitter=(0.0, 0.001, 0.002))]
    (sentence,) = claims([("FMNIST", table, 0.10)], (1,))
    assert "d2p2 at epsilon 1: 10.1% [9.9, 10.3] (3/3 diverged) vs dpsgd 66.0% [63.5, 68.5] (-55.9" in sentence
