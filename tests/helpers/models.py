"""Small models covering every layer type the hook engine has a rule for, a few others several tests share, and
their batches."""

import torch
from torch import nn

from dpbench.models.cnn import TFPrivacyCNN
from dpbench.models.lstm import LSTMClassifier, LSTMConfig


class SequenceModel(nn.Module):
    """Embedding (with padding and repeated tokens), Conv1d, LayerNorm, GroupNorm and Linear over positions."""

    def __init__(self, vocab: int = 30, dim: int = 12, classes: int = 3):
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim, padding_idx=0)
        self.conv = nn.Conv1d(dim, dim, 3, padding=1)
        self.group_norm = nn.GroupNorm(3, dim)
        self.layer_norm = nn.LayerNorm(dim)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embedding(ids)  # (B, T, d)
        h = self.group_norm(self.conv(h.transpose(1, 2))).transpose(1, 2)
        h = torch.tanh(self.mix(self.layer_norm(h)))
        return self.head(h.mean(1))


class TiedModel(nn.Module):
    """One Linear used twice: its per-sample gradient is the sum over both calls."""

    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(6, 6)
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        return self.head(torch.tanh(self.shared(torch.tanh(self.shared(x)))))


class DropoutMLP(nn.Module):
    """Dropout before and after a hidden layer over sequence_batch's tokens: a model that draws random numbers."""

    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(8, 6)
        self.hidden = torch.nn.Linear(6, 5)
        self.output = torch.nn.Linear(5, 3)
        self.dropout = torch.nn.Dropout(0.5)

    def forward(self, ids):
        return self.output(self.dropout(torch.relu(self.hidden(self.dropout(self.embedding(ids).mean(1))))))


def small_lstm() -> nn.Module:
    """dpbench's LSTM classifier at its smallest, over sequence_batch's 8 tokens and 3 classes."""
    return LSTMClassifier(8, 3, LSTMConfig(embedding_dim=6, hidden_size=5, dense_size=4))


def cnn_batch(size: int = 6, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(size, 1, 28, 28, generator=generator), torch.randint(0, 10, (size,), generator=generator)


def sequence_batch(size: int = 5, length: int = 7, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 8, (size, length), generator=generator)  # small range: repeats and padding
    return ids, torch.randint(0, 3, (size,), generator=generator)


def tied_batch(size: int = 5, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(size, 6, generator=generator), torch.randint(0, 2, (size,), generator=generator)


def w2v_batch(vocab: int, size: int, seed: int = 0, window: int = 4, negatives: int = 8):
    """A word2vec batch over `vocab` words: each sample's center word (also its target), context and negatives."""
    generator = torch.Generator().manual_seed(seed)
    inputs = {
        "center": torch.randint(vocab, (size,), generator=generator),
        "context": torch.randint(vocab, (size, window), generator=generator),
        "negatives": torch.randint(vocab, (size, negatives), generator=generator),
    }
    return inputs, inputs["center"].clone()


def features_model() -> nn.Module:
    """GroupNorm on (B, C) features, no spatial dimensions (its rule once summed over every dimension there)."""
    return nn.Sequential(nn.Linear(6, 6), nn.GroupNorm(2, 6), nn.Tanh(), nn.Linear(6, 2))


CASES = {
    "cnn": (lambda: TFPrivacyCNN(), cnn_batch),
    "features": (features_model, tied_batch),
    "sequence": (lambda: SequenceModel(), sequence_batch),
    "tied": (lambda: TiedModel(), tied_batch),
}
