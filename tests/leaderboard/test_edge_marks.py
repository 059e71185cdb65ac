"""Which entries the report marks "tuned on its grid's edge": read from the search that chose each one's point, from
the scores the report may show, never from a private tuning's unreleased trials."""

from dpbench.leaderboard import load_suite
from dpbench.leaderboard.private_selection import Selection
from dpbench.leaderboard.report import mark_edges
from dpbench.leaderboard.summary import Entry, Tuning
from tests.helpers.leaderboard_suites import word2vec_totals


def test_an_entry_is_marked_tuned_on_the_edge_from_released_scores_only(tmp_path):
    """mark_edges reads the search that chose the entry's point; a private tuning releases only its winner, so its
    trials' exact values never decide a mark."""
    path = tmp_path / "suite.yaml"
    path.write_text(word2vec_totals("", "dpadam, nonprivate"))
    suite = load_suite("totals", path)
    record = Tuning("dpadam", "DP-Adam", 3.0, [(0.001, 1.0, 0.50, "done"), (0.01, 5.0, 0.70, "done")])
    entry = Entry("w2v", "dpadam", "dpadam", "DP-Adam", 3.0, metric="accuracy", lr=0.01, clip_norm=5.0)
    mark_edges(suite, {"w2v": [entry]}, {"w2v": [record]}, {})
    assert entry.on_edge  # the best trial sits at the top of both ranges
    hidden = Entry("w2v", "dpadam", "dpadam", "DP-Adam", 3.0, metric="accuracy", lr=0.01, clip_norm=5.0)
    private = Selection(0.01, 5.0, "geometric", 4.0, 10.0, 1.0, 2.0, 1.5, 1e-6)
    mark_edges(suite, {"w2v": [hidden]}, {"w2v": [record]}, {("w2v", "dpadam", 3.0): private})
    assert not hidden.on_edge
