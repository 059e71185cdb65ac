"""A loss task's releasable score: the validation split's mean loss with each example's capped at the task's bound B,
so that one example moves its sum by at most B; the evaluation logs it and results.json records it."""

import json
from types import SimpleNamespace

import torch

from dpbench.core.results import read_results
from dpbench.core.tasks import NegativeSamplingTask, capped_losses
from dpbench.models.word2vec import Word2Vec
from dpbench.training.module import DPModule
from tests.helpers.cli import FAST, dpbench, results
from tests.helpers.models import w2v_batch

TASK = NegativeSamplingTask()
BOUND = TASK.score_bound


def _model() -> Word2Vec:
    """Wide enough initial scores that some examples' losses pass the bound."""
    torch.manual_seed(0)
    return Word2Vec(50, 100, mode="cbow", tied=False, init_std=1.5)


def _logged(model: Word2Vec, batch) -> dict[str, float]:
    """What the evaluation logs for one batch (DPModule._evaluate on the real task and model)."""
    logged = {}
    module = SimpleNamespace(task=TASK, model=model, log=lambda name, value, **_: logged.__setitem__(name, value))
    DPModule._evaluate(module, batch, "val")
    return logged


def test_the_logged_capped_mean_is_the_mean_of_each_examples_loss_capped_at_the_bound():
    model = _model()
    inputs, targets = w2v_batch(50, 64, seed=3)
    by_hand = []
    for i in range(64):
        one = ({key: value[i:i + 1] for key, value in inputs.items()}, targets[i:i + 1])
        by_hand.append(min(TASK.per_sample_loss(model, one)[0].item(), BOUND))
    assert 0 < sum(loss == BOUND for loss in by_hand) < 64  # the cap matters here
    logged = _logged(model, (inputs, targets))
    assert abs(logged["val/capped_loss"] - sum(by_hand) / 64) < 1e-4
    assert logged["val/capped_loss"] < logged["val/loss"]


def test_one_added_example_moves_the_capped_sum_by_at_most_the_bound():
    model = _model()
    inputs, targets = w2v_batch(50, 32, seed=4)
    with torch.no_grad():  # word 0 scores itself hugely: as its own negative its loss is about 8 * 1e4
        model.embedding.weight[0] = 10.0
        model.output.weight[0] = 10.0
    outlier = {"center": torch.tensor([0]), "context": torch.zeros(1, 4, dtype=torch.long),
               "negatives": torch.zeros(1, 8, dtype=torch.long)}
    added = ({key: torch.cat([value, outlier[key]]) for key, value in inputs.items()},
             torch.cat([targets, torch.tensor([0])]))
    losses = TASK.per_sample_loss(model, (inputs, targets)).detach()
    more = TASK.per_sample_loss(model, added).detach()
    assert float(more.sum() - losses.sum()) > 1e4  # uncapped, one example moves the sum without limit
    moved = float(capped_losses(more, BOUND).sum() - capped_losses(losses, BOUND).sum())
    assert 0 <= moved <= BOUND
    assert capped_losses(torch.tensor([float("nan"), float("inf"), 2.0]), BOUND).tolist() == [BOUND, BOUND, 2.0]


def test_a_word2vec_run_records_its_capped_validation_loss_and_old_files_still_read(tmp_path):
    run = dpbench("model=word2vec", "data=bbc_news", "model.init_std=1.0", "data.train_size=1000",
                  "++data.validation_size=300", "max_steps=2", "batch_size=100", "privacy.epsilon=3",
                  "trainer.checkpoint=false", f"hydra.run.dir={tmp_path / 'run'}", *FAST)
    assert run.returncode == 0, run.stderr[-3000:]
    out = results(tmp_path / "run")
    assert out["test_metric"] == "loss" and out["validation_size"] == 300 and out["score_bound"] == BOUND
    assert 0 < out["validation_capped_loss"] < out["validation_loss"]  # at init_std=1 some losses pass 30
    assert read_results(tmp_path / "run").validation_capped_loss == out["validation_capped_loss"]
    legacy = {key: value for key, value in out.items() if key not in ("validation_capped_loss", "score_bound")}
    (tmp_path / "results.json").write_text(json.dumps(legacy))
    record = read_results(tmp_path)
    assert record.validation_capped_loss is None and record.score_bound is None
