"""Word2vec with negative sampling (Mikolov et al. 2013), CBOW or skip-gram, as in Zhang, Mironov, Hejazinia.

Each embedding table is called once per forward pass on all the ids it serves, so the hook engine sees one call
site per table and computes per-sample gradients sparsely (touched rows only, never batch x vocabulary x dim).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dpbench.core.errors import ConfigurationError

MODES = ("cbow", "skipgram")


@dataclass
class Word2VecConfig:
    name: str = "word2vec"
    vocab_size: int = 1000
    """Vocabulary (the data's vocab_size follows it); up to tens of thousands."""
    dim: int = 100
    mode: str = "cbow"
    """cbow (mean of the context predicts the centre word) | skipgram (the centre word predicts each context word)."""
    tied: bool = False
    """true: one table for words and contexts (the paper's count, 1K x 100 = 100K parameters), but its scores E E^T
    are positive semi-definite, so it cannot score most negatives below 0 and barely learns; false: an output table."""
    init_std: float = 0.1


class Word2Vec(nn.Module):
    """forward({"center", "context", "negatives"}) -> (positive scores (B, P), negative scores (B, K))."""

    def __init__(self, vocab_size: int, dim: int = 100, mode: str = "cbow", tied: bool = True, init_std: float = 0.1):
        super().__init__()
        if mode not in MODES:
            raise ConfigurationError(f"model.mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.embedding = nn.Embedding(vocab_size, dim)
        self.output = None if tied else nn.Embedding(vocab_size, dim)
        for table in (self.embedding, self.output):
            if table is not None:
                nn.init.normal_(table.weight, std=init_std)

    def forward(self, inputs: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        center, context, negatives = inputs["center"].unsqueeze(1), inputs["context"], inputs["negatives"]
        if self.mode == "cbow":
            source, predicted = context, torch.cat([center, negatives], 1)
        else:
            source, predicted = center, torch.cat([context, negatives], 1)
        if self.output is None:
            both = self.embedding(torch.cat([source, predicted], 1))
            hidden, targets = both[:, : source.shape[1]].mean(1), both[:, source.shape[1] :]
        else:
            hidden, targets = self.embedding(source).mean(1), self.output(predicted)
        scores = torch.einsum("bd,bkd->bk", hidden, targets)
        positives = scores.shape[1] - negatives.shape[1]
        return scores[:, :positives], scores[:, positives:]

    @torch.no_grad()
    def log_probs(self, words: Tensor) -> Tensor:
        """log Pr(w | words) over the vocabulary (B, V): softmax of the mean embedding of `words` (B, m)."""
        hidden = self.embedding(words).mean(1)
        table = self.embedding if self.output is None else self.output
        return torch.log_softmax(hidden @ table.weight.T, dim=-1)


def build_word2vec(config: Word2VecConfig, data) -> Word2Vec:
    if data.task.metric_name != "loss" or data.vocab_size is None or not isinstance(data.train.features, dict):
        raise ConfigurationError(f"model=word2vec needs word2vec data (data=bbc_news or brown), not data={data.name}")
    if data.vocab_size != config.vocab_size:
        raise ConfigurationError(
            f"model.vocab_size={config.vocab_size} but data.vocab_size={data.vocab_size}: set both (the data config "
            "follows model.vocab_size by default)"
        )
    return Word2Vec(config.vocab_size, config.dim, config.mode, config.tied, config.init_std)
