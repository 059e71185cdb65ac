"""Recurrent layers of every kind and configuration inside a small float64 classifier, with batches: the models the
hook engine's recurrent rules are checked on (tests/per_sample/test_recurrent_rules.py, test_rnn_gate_forward.py)."""

import torch
from torch import nn

FEATURES, HIDDEN, CLASSES = 3, 4, 3

KINDS = {
    "rnn_tanh": lambda **kw: nn.RNN(FEATURES, HIDDEN, nonlinearity="tanh", **kw),
    "rnn_relu": lambda **kw: nn.RNN(FEATURES, HIDDEN, nonlinearity="relu", **kw),
    "gru": lambda **kw: nn.GRU(FEATURES, HIDDEN, **kw),
    "lstm": lambda **kw: nn.LSTM(FEATURES, HIDDEN, **kw),
}


class ReadsEveryOutput(nn.Module):
    """A Linear before the recurrent layer, and a head reading its output sequence and its final state(s)."""

    def __init__(self, recurrent: nn.RNNBase):
        super().__init__()
        self.inside = nn.Linear(FEATURES, FEATURES)
        self.recurrent = recurrent
        directions = 2 if recurrent.bidirectional else 1
        states = 2 if isinstance(recurrent, nn.LSTM) else 1
        self.head = nn.Linear(HIDDEN * directions + HIDDEN * states, CLASSES)

    def forward(self, x):
        x = torch.tanh(self.inside(x))  # (B, T, F)
        if not self.recurrent.batch_first:
            x = x.transpose(0, 1)
        output, state = self.recurrent(x)
        finals = [state[-1]] if isinstance(state, torch.Tensor) else [s[-1] for s in state]
        return self.head(torch.cat([torch.tanh(output).mean(1 if self.recurrent.batch_first else 0), *finals], 1))


def model_and_batches(kind: str, seed: int = 0, size: int = 5, **options):
    """A float64 ReadsEveryOutput around a recurrent layer of `kind`, and two batches of `size` sequences."""
    torch.manual_seed(seed)
    model = ReadsEveryOutput(KINDS[kind](**options)).double()
    generator = torch.Generator().manual_seed(seed + 1)

    def batch():
        x = torch.randn(size, 6, FEATURES, generator=generator, dtype=torch.float64)
        return x, torch.randint(0, CLASSES, (size,), generator=generator)

    return model, batch(), batch()


CONFIGURATIONS = [  # every (num_layers, bidirectional) pair, and each of bias and batch_first both ways with both
    {"num_layers": layers, "bidirectional": bidirectional, "bias": bias, "batch_first": batch_first}
    for layers, bidirectional, bias, batch_first in [(1, False, True, True), (1, True, False, False),
                                                     (2, False, False, True), (2, True, True, False)]
]


def configuration_name(options: dict) -> str:
    """The test id of one of CONFIGURATIONS."""
    return "-".join(f"{key}={value}" for key, value in options.items())
