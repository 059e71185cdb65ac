"""End to end (~15 s): the sparse_word2vec experiment with canaries, then the canary audit on its run."""

import subprocess
import sys

from tests.helpers.cli import FAST, ROOT, dpbench, results


def test_sparse_word2vec_experiment_and_canary_audit(tmp_path):
    run = dpbench("+experiment=sparse_word2vec", "max_steps=30", "data.train_size=1000", "data.canaries=20",
                  "privacy.epsilon=3", "privatizer.draw_epsilon=0.002", "profiler.warmup_steps=2",
                  f"hydra.run.dir={tmp_path}", *FAST, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    out = results(tmp_path)
    assert out["privatizer"] == "sparse" and out["model"] == "word2vec" and out["data"] == "bbc_news"
    assert out["test_metric"] == "loss" and out["steps"] == 30
    assert 2.9 <= out["epsilon"] <= 3.0 and out["draw_epsilon"] == 0.002
    assert out["selection_draws"] == 200 and out["num_coordinates"] == 200_000  # two 1K x 100 tables
    assert out["theorem3_epsilon"] > 0 and not out["theorem3_lemmas_hold"]  # sigma ~ 0.7: Lemma 3 needs eps <= 1
    audit = subprocess.run([sys.executable, "-m", "dpbench.audit", str(tmp_path), "--references", "500"], cwd=ROOT,
                           capture_output=True, text=True, timeout=600)
    assert audit.returncode == 0, audit.stderr[-3000:]
    assert (tmp_path / "canary_ranks.png").exists() and (tmp_path / "canary_audit.json").exists()
