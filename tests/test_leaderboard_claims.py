"""The leaderboard's verdicts on the papers' claims and its winners, on hand-built tables whose answer is known."""

from dpbench.leaderboard.claims import check_claims, winners
from dpbench.leaderboard.summary import Entry


def entry(method: str, epsilon: float | None, accuracy: float | None, step_s: float = 0.1, peak_mb: float = 100.0,
          label: str | None = None, refused: str | None = None) -> Entry:
    values = [] if accuracy is None else [accuracy - 0.01, accuracy, accuracy + 0.01]
    return Entry(task="t", method=method, variant=label or method, label=label or method, epsilon=epsilon,
                 metric="accuracy", values=values, step_s=[step_s] * len(values), peak_mb=[peak_mb] * len(values),
                 refused=refused)


def jl_sentence(rungs: list[Entry]) -> str:
    table = [entry("dpsgd", 3, 0.90, step_s=0.4), *rungs]
    (sentence,) = [s for s in check_claims([("CNN", "sgd", table, None)], (3,), 3) if s.startswith("JL")]
    return sentence


def test_jl_claim_is_judged_on_every_measured_rung():
    useless_small_r = entry("jl", 3, 0.10, step_s=0.25, label="JL (r=2)")
    usable_r = entry("jl", 3, 0.89, step_s=0.3, label="JL (r=10)")
    sentence = jl_sentence([useless_small_r, usable_r])
    assert "JL (r=2) 10.0% (-80.0 points) at 0.62x" in sentence and "JL (r=10) 89.0% (-1.0 points) at 0.75x" in sentence
    assert sentence.endswith("holds here.")
    assert jl_sentence([useless_small_r]).endswith("**does not hold here**.")
    slow = entry("jl", 3, 0.90, step_s=0.5, label="JL (r=10)")
    assert jl_sentence([useless_small_r, slow]).endswith("**does not hold here**.")  # close, but slower


def test_jl_claim_names_the_refused_rungs():
    refused = entry("jl", 3, None, label="JL (r=1)", refused="unreachable")
    sentence = jl_sentence([refused, entry("jl", 3, 0.895, step_s=0.2, label="JL (r=2)")])
    assert "(smaller r refused: JL (r=1))" in sentence and sentence.endswith("holds here.")


def test_grape_d2p2_and_sparse_verdicts():
    vit = [entry("dpadam", 3, 0.70, peak_mb=200), entry("grape", 3, 0.69, peak_mb=120)]
    cnn = [entry("dpsgd", 1, 0.80), entry("d2p2", 1, 0.84), entry("dpsgd", 8, 0.92), entry("d2p2", 8, 0.93)]
    cnn_worse = [entry("dpsgd", 1, 0.80), entry("d2p2", 1, 0.75), entry("dpsgd", 8, 0.92), entry("d2p2", 8, 0.93)]
    sentences = check_claims([("ViT", "adam", vit, None), ("CNN", "sgd", cnn, None), ("CNN2", "sgd", cnn_worse, None)],
                             (1, 8), 3)
    grape, d2p2, d2p2_worse = sentences
    assert "0.60x its peak memory" in grape and grape.endswith("holds here.")
    assert d2p2.startswith("D2P2") and d2p2.endswith("holds here.")
    assert d2p2_worse.endswith("**does not hold here**.")
    heavy = check_claims([("ViT", "adam", [entry("dpadam", 3, 0.70, peak_mb=200),
                                           entry("grape", 3, 0.69, peak_mb=190)], None)], (3,), 3)
    assert heavy[0].endswith("**does not hold here**.")  # 0.95x memory is not "far less"


def test_winner_and_margin_over_the_better_vanilla():
    table = [entry("dpsgd", 3, 0.90), entry("dpadam", 3, 0.92), entry("d2p2", 3, 0.95, label="D2P2-SGD"),
             entry("dpsgd", 8, 0.93), entry("dpadam", 8, 0.94)]
    assert winners(table, (3, 8)) == ["epsilon 3: **D2P2-SGD** 95.0%, +3.0 points over dpadam (92.0%)",
                                      "epsilon 8: **dpadam** 94.0% (vanilla itself)"]


def test_nothing_is_judged_or_crowned_at_a_constant_prediction_s_accuracy():
    """Two methods that both predict the majority class are not "close", and neither wins."""
    table = [entry("dpadam", 3, 0.592, step_s=1.0), entry("jl", 3, 0.592, step_s=0.5, label="JL (r=2)")]
    (sentence,) = check_claims([("BiLSTM", "adam", table, 0.59)], (3,), 3)
    assert sentence == ("JL, epsilon 3, BiLSTM: cannot be judged here, no method compared beats a constant "
                        "prediction's 59.0% (dpadam 59.2%, JL (r=2) 59.2%).")
    assert check_claims([("BiLSTM", "adam", table, None)], (3,), 3)[0].endswith("holds here.")
    assert winners(table, (3,), 0.59) == [
        "epsilon 3: none, no private method beats a constant prediction (59.0%; best dpadam 59.2%)"]
    learned = [entry("dpadam", 3, 0.75), entry("jl", 3, 0.74, label="JL (r=2)")]
    assert winners(learned, (3,), 0.59) == ["epsilon 3: **dpadam** 75.0% (vanilla itself)"]


def test_d2p2_is_judged_only_on_budgets_where_something_learned():
    at_chance_small_eps = [entry("dpsgd", 1, 0.59), entry("d2p2", 1, 0.595), entry("dpsgd", 8, 0.80),
                           entry("d2p2", 8, 0.70)]
    (sentence,) = check_claims([("BiLSTM", "sgd", at_chance_small_eps, 0.59)], (1, 8), 8)
    assert "epsilon 1" not in sentence and sentence.endswith("**does not hold here**.")


def test_jl_without_timings_cannot_be_checked():
    untimed = entry("jl", 3, 0.89, label="JL (r=10)")
    untimed.step_s = []
    assert jl_sentence([untimed]).endswith("cannot be checked, no rung recorded its time per step.")
