"""Canary exposure (Zhang, Mironov, Hejazinia, Section 6.5; Carlini et al. 2019's random-sampling rank).

Canaries are random three-word phrases inserted into the training corpus (data.canaries). After training, each
canary's log-perplexity P(c) = -log Pr(c1 | c0) - log Pr(c2 | c0, c1) is compared with that of `references`
random phrases (c0, c1', c2'); its rank is the fraction of them that the model finds *less* likely. A model that
has not memorized the canaries gives ranks uniform on [0, 1]; memorization piles them up near 1. A Pearson
chi-squared test against the uniform histogram gives the p-value. Works for any privatizer: it only reads the model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats
from torch import Tensor

from dpbench.models.word2vec import Word2Vec


def log_perplexity(model: Word2Vec, phrases: Tensor) -> Tensor:
    """(N,) -log Pr(c1 | c0) - log Pr(c2 | c0, c1) of three-word phrases (N, 3)."""
    first = model.log_probs(phrases[:, :1]).gather(1, phrases[:, 1:2]).squeeze(1)
    second = model.log_probs(phrases[:, :2]).gather(1, phrases[:, 2:3]).squeeze(1)
    return -(first + second)


@torch.no_grad()
def canary_ranks(model: Word2Vec, canaries: Tensor, references: int = 10_000, seed: int = 0) -> np.ndarray:
    """Per canary: the fraction of `references` random phrases (same first word) less likely than the canary.

    The context is the mean of its word embeddings, so the scores of a two-word context are the mean of two rows of
    S = E_in E_out^T: each canary needs one (distinct second words x V) log-softmax, not one per phrase.
    """
    generator = torch.Generator().manual_seed(seed)
    table = model.embedding.weight if model.output is None else model.output.weight
    vocab = table.shape[0]

    def scores(words: Tensor) -> Tensor:
        return model.embedding.weight[words] @ table.T

    ranks = np.empty(len(canaries))
    for i, canary in enumerate(canaries):
        second, third = torch.randint(vocab, (2, references), generator=generator)
        words, inverse = torch.unique(torch.cat([canary[1:2], second]), return_inverse=True)
        first_word = scores(canary[:1])  # (1, V)
        pair = torch.log_softmax((first_word + scores(words)) / 2, dim=1)  # log Pr(. | c0, w), (U, V)
        first = torch.log_softmax(first_word[0], dim=0)
        perplexity = -(first[torch.cat([canary[1:2], second])] + pair[inverse, torch.cat([canary[2:3], third])])
        ranks[i] = float((perplexity[1:] > perplexity[0]).double().mean())
    return ranks


@dataclass(frozen=True)
class Uniformity:
    counts: list[int]
    chi2: float
    p_value: float


def uniformity(ranks: np.ndarray, bins: int = 10) -> Uniformity:
    """Pearson's chi-squared goodness of fit of the rank histogram to the uniform distribution."""
    counts, _ = np.histogram(np.clip(ranks, 0.0, 1.0), bins=bins, range=(0.0, 1.0))
    result = stats.chisquare(counts)
    return Uniformity(counts.tolist(), float(result.statistic), float(result.pvalue))


def plot_histograms(panels: dict[str, np.ndarray], path, bins: int = 10) -> None:
    """One rank histogram per label (Figure 2), with the chi-squared p-value in each title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 2.8), squeeze=False)
    for axis, (label, ranks) in zip(axes[0], panels.items(), strict=True):
        test = uniformity(ranks, bins)
        axis.hist(ranks, bins=bins, range=(0, 1), color="tab:blue", edgecolor="white")
        axis.axhline(len(ranks) / bins, color="black", linestyle="--", linewidth=1)
        axis.set_title(f"{label}\np = {test.p_value:.2g}", fontsize=9)
        axis.set_xlabel("canary rank")
    axes[0][0].set_ylabel("canaries")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
