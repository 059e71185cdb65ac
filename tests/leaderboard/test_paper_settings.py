"""Each seed paper's claim in its own setting (issue 28): D2P2-SGD's 4-layer CNN on Fashion-MNIST, and the sparse
paper's word2vec samples (one target, one context, 8 negatives) at batch 20. The configs hold the papers' values,
the model is Table 5's, the data gives the paper's samples, and both recipes run through the CLI."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dpbench.app import hydra_setup
from dpbench.core.errors import ConfigurationError
from dpbench.core.tasks import NegativeSamplingTask
from dpbench.data import DataBundle, TensorSplit
from dpbench.data.corpus import as_pairs
from dpbench.models import build_model
from dpbench.models.word2vec import Word2Vec
from tests.helpers.cli import FAST, dpbench, results


def composed(*overrides: str):
    return hydra_setup.compose(overrides)


def images(size: int, channels: int = 1) -> DataBundle:
    split = TensorSplit(torch.zeros(2, channels, size, size), torch.zeros(2, dtype=torch.long))
    return DataBundle("fashion_mnist", split, split, 10, (channels, size, size))


def test_the_d2p2_recipe_holds_the_papers_hyperparameters():
    cfg = composed("+experiment=d2p2_paper_fashion_mnist")
    assert (cfg.model.name, cfg.data.name, cfg.privatizer.name, cfg.optimizer.name) == (
        "cnn_d2p2", "fashion_mnist", "d2p2", "sgd")
    assert (cfg.batch_size, cfg.epochs, cfg.optimizer.lr, cfg.optimizer.momentum) == (1024, 40, 0.01, 0.0)
    assert (cfg.privatizer.gamma, cfg.privacy.clip_norm, cfg.privacy.sampling) == (0.01, 1.0, "poisson")


def test_the_cnn_is_table_5():
    """Four 3x3 stride-1 convolutions (16, 32, 32, 64), average pooling, global average pooling, dense 64 -> 10."""
    model = build_model(composed("+experiment=d2p2_paper_fashion_mnist").model, images(28))
    convolutions = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.stride) for c in convolutions] == [
        (16, (3, 3), (1, 1)), (32, (3, 3), (1, 1)), (32, (3, 3), (1, 1)), (64, (3, 3), (1, 1))]
    assert sum(isinstance(m, torch.nn.AvgPool2d) for m in model.modules()) == 3
    assert sum(isinstance(m, torch.nn.AdaptiveAvgPool2d) for m in model.modules()) == 1
    assert [(m.in_features, m.out_features) for m in model.modules() if isinstance(m, torch.nn.Linear)] == [(64, 10)]
    assert sum(p.numel() for p in model.parameters()) == 33_194
    assert model(torch.zeros(3, 1, 28, 28)).shape == (3, 10)


def test_the_cnn_refuses_images_it_would_pool_away_and_non_images():
    config = composed("model=cnn_d2p2").model
    assert build_model(config, images(8))(torch.zeros(1, 1, 8, 8)).shape == (1, 10)  # the smallest side that works
    with pytest.raises(ConfigurationError, match="too small"):
        build_model(config, images(7))
    tokens = TensorSplit(torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, dtype=torch.long))
    text = DataBundle("sst2", tokens, tokens, 2)
    with pytest.raises(ConfigurationError, match="needs image data"):
        build_model(config, text)


def test_the_sparse_recipe_holds_the_papers_hyperparameters():
    cfg = composed("+experiment=sparse_paper_word2vec")
    assert (cfg.model.mode, cfg.model.vocab_size, cfg.model.dim, cfg.data.vocab_size) == ("skipgram", 1000, 100, 1000)
    assert (cfg.data.pairs, cfg.data.window, cfg.data.negatives, cfg.data.train_size) == (True, 4, 8, 200_000)
    assert (cfg.batch_size, cfg.epochs, cfg.optimizer.name, cfg.optimizer.lr) == (20, 20, "adam", 1e-3)
    assert (cfg.privacy.clip_norm, cfg.privacy.epsilon) == (15.0, 30.0)
    assert (cfg.privatizer.sparsity, cfg.privatizer.clip2, cfg.privatizer.selection_clip) == (0.001, 0.05, 0.1)


def test_pairs_are_one_target_one_context_word_each():
    centres, contexts = np.array([5, 6]), np.array([[1, 2, 3, 4], [7, 8, 9, 10]])
    paired_centres, paired_contexts = as_pairs(centres, contexts)
    assert paired_centres.tolist() == [5, 5, 5, 5, 6, 6, 6, 6]
    assert paired_contexts.tolist() == [[1], [2], [3], [4], [7], [8], [9], [10]]


def test_a_skipgram_pair_has_the_papers_loss():
    """-log s(e_t . e_c) - sum_n log s(-e_t . e_n), with e_t from the input table and e_c, e_n from the output."""
    model = Word2Vec(30, 5, mode="skipgram", tied=False)
    inputs = {"center": torch.tensor([3]), "context": torch.tensor([[7]]), "negatives": torch.tensor([[1, 2, 4]])}
    loss = NegativeSamplingTask().per_sample_loss(model, (inputs, None))
    e_t, out = model.embedding.weight[3].detach(), model.output.weight.detach()
    expected = -F.logsigmoid(e_t @ out[7]) - F.logsigmoid(-out[[1, 2, 4]] @ e_t).sum()
    torch.testing.assert_close(loss.detach(), expected.unsqueeze(0))


@pytest.mark.parametrize("privatizer", ["d2p2", "vanilla"])
def test_the_d2p2_recipe_runs_through_the_cli(tmp_path, small_fashion_mnist, privatizer):
    dim = ["privatizer.dim=9958"] if privatizer == "d2p2" else []
    run = dpbench("+experiment=d2p2_paper_fashion_mnist", f"privatizer={privatizer}", *dim,
                  f"data.fashion_mnist_dir={small_fashion_mnist}", "batch_size=128", "max_steps=2",
                  "trainer.num_threads=1", "trainer.checkpoint=false", f"hydra.run.dir={tmp_path / 'run'}", *FAST)
    assert run.returncode == 0, run.stderr[-2000:]
    written = results(tmp_path / "run")
    assert (written["model"], written["data"], written["privatizer"]) == ("cnn_d2p2", "fashion_mnist", privatizer)
    assert (written["train_size"], written["steps"]) == (512, 2) and written["epsilon"] <= 3.0


@pytest.mark.slow  # builds the BBC News samples (about 20 s)
@pytest.mark.parametrize("privatizer", ["sparse", "vanilla"])
def test_the_sparse_recipe_runs_through_the_cli(tmp_path, privatizer):
    run = dpbench("+experiment=sparse_paper_word2vec", f"privatizer={privatizer}", "data.train_size=2000",
                  "epochs=1", "max_steps=5", "privacy.epsilon=8", "trainer.checkpoint=false",
                  f"hydra.run.dir={tmp_path / 'run'}", *FAST)
    assert run.returncode == 0, run.stderr[-2000:]
    written = results(tmp_path / "run")
    assert (written["model"], written["data"], written["privatizer"]) == ("word2vec", "bbc_news", privatizer)
    assert (written["train_size"], written["steps"], written["batch_size"]) == (2000, 5, 20)
    assert written["epsilon"] <= 8.0 and written["test_metric"] == "loss"
