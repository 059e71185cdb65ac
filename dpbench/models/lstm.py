"""The bidirectional LSTM text classifier of Bu et al. 2021 (the TensorFlow IMDb tutorial network)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dpbench.data.text import PAD


@dataclass
class LSTMConfig:
    name: str = "lstm"
    embedding_dim: int = 64
    hidden_size: int = 64
    dense_size: int = 64
    bidirectional: bool = True
    num_layers: int = 1


class LSTMClassifier(nn.Module):
    """embedding (vocab x 64, padding row 0) -> BiLSTM 64 -> dense 64 relu -> output.

    The final hidden states of both directions feed the head; with the data's `pre` padding the forward direction
    ends on the last real token. nn.LSTM is used as is (fast oneDNN kernel): dpbench's hook engine has an exact
    per-sample rule for it and JL runs it in forward mode.
    """

    def __init__(self, vocab_size: int, num_classes: int, config: LSTMConfig):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, config.embedding_dim, padding_idx=PAD)
        self.lstm = nn.LSTM(
            config.embedding_dim, config.hidden_size, num_layers=config.num_layers,
            bidirectional=config.bidirectional, batch_first=True,
        )
        directions = 2 if config.bidirectional else 1
        self.dense = nn.Linear(directions * config.hidden_size, config.dense_size)
        self.output = nn.Linear(config.dense_size, num_classes)

    def forward(self, ids: Tensor) -> Tensor:
        _, (hidden, _) = self.lstm(self.embedding(ids))
        last = hidden[-2:] if self.lstm.bidirectional else hidden[-1:]  # the top layer's directions
        features = torch.cat(list(last), dim=1)
        return self.output(torch.relu(self.dense(features)))
