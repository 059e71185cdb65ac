"""Canary exposure: log-perplexity by hand, ranks of planted vs random phrases, the chi-squared test, the plot."""

import numpy as np
import pytest
import torch
from scipy import stats

from dpbench.audit.canary import canary_ranks, log_perplexity, plot_histograms, uniformity
from dpbench.data.corpus import make_canaries
from dpbench.models.word2vec import Word2Vec


def test_log_perplexity_by_hand():
    torch.manual_seed(0)
    model = Word2Vec(12, 4, tied=False)
    phrase = torch.tensor([[3, 7, 1]])
    e_in, e_out = model.embedding.weight.detach(), model.output.weight.detach()
    first = torch.log_softmax(e_out @ e_in[3], 0)[7]
    second = torch.log_softmax(e_out @ ((e_in[3] + e_in[7]) / 2), 0)[1]
    torch.testing.assert_close(log_perplexity(model, phrase)[0], -(first + second))


def test_ranks_agree_with_log_perplexity_of_the_sampled_phrases():
    torch.manual_seed(0)
    model = Word2Vec(30, 6)
    canaries = make_canaries(30, 4, seed=0)
    ranks = canary_ranks(model, canaries, references=500, seed=5)
    generator = torch.Generator().manual_seed(5)
    for canary, rank in zip(canaries, ranks, strict=True):
        second, third = torch.randint(30, (2, 500), generator=generator)
        phrases = torch.stack([canary[0].expand(500), second, third], 1)
        reference = log_perplexity(model, phrases)
        assert rank == pytest.approx(float((reference > log_perplexity(model, canary[None])).double().mean()))


def test_memorized_canaries_are_detected_and_random_ones_are_not():
    torch.manual_seed(0)
    vocab, dim = 400, 16
    model = Word2Vec(vocab, dim)
    canaries = make_canaries(vocab, 30, seed=1)
    untrained = canary_ranks(model, canaries, references=400)
    assert uniformity(untrained).p_value > 0.001
    with torch.no_grad():  # plant each canary: its words' embeddings made nearly identical
        for c0, c1, c2 in canaries.tolist():
            shared = torch.randn(dim) * 3
            for word in (c0, c1, c2):
                model.embedding.weight[word] = shared + 0.01 * torch.randn(dim)
    memorized = canary_ranks(model, canaries, references=400)
    assert memorized.mean() > 0.8
    assert uniformity(memorized).p_value < 1e-6


def test_uniformity_is_pearsons_chi_squared(tmp_path):
    ranks = np.random.default_rng(0).random(300) ** 2  # skewed towards 0
    test = uniformity(ranks, bins=5)
    counts = np.histogram(ranks, bins=5, range=(0, 1))[0]
    expected = np.full(5, 60.0)
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert test.counts == counts.tolist()
    assert test.chi2 == pytest.approx(chi2)
    assert test.p_value == pytest.approx(stats.chi2.sf(chi2, df=4))
    plot_histograms({"a": ranks, "b": np.linspace(0, 1, 300)}, tmp_path / "ranks.png")
    assert (tmp_path / "ranks.png").stat().st_size > 1000
