"""Exact per-sample gradients of nn.RNN (tanh, relu), nn.GRU and nn.LSTM in the hook engine, against a per-example
loop in float64, and the refusals the recompute from the recorded input needs."""

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from dpbench.core.errors import UnsupportedModelError
from dpbench.core.tasks import ClassificationTask
from dpbench.privatizers.per_sample import HookEngine, make_engine
from tests.per_sample_reference import (
    assert_matches_loop,
    assert_only_the_replaced_norm_moves,
    loop_gradients,
    loop_norms,
)

pytestmark = pytest.mark.models_as_built

TASK = ClassificationTask()
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


def _name(options: dict) -> str:
    return "-".join(f"{key}={value}" for key, value in options.items())


@pytest.mark.parametrize("options", CONFIGURATIONS, ids=_name)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_hook_rule_matches_a_per_example_loop(kind, options):
    model, batch, other = model_and_batches(kind, **options)
    engine = HookEngine(model)
    reference = loop_gradients(model, batch)
    assert_matches_loop(engine.per_sample_gradients(TASK, batch), reference)
    norms = loop_norms(reference)
    clipped = engine.clipped_sum(TASK, batch, float(norms.median()))
    torch.testing.assert_close(clipped.norms, norms, atol=1e-6, rtol=1e-6)
    assert_only_the_replaced_norm_moves(lambda b: engine.clipped_sum(TASK, b, 1.0).norms, batch, other)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_auto_engine_serves_recurrent_models_with_the_hook_rules(kind):
    model, batch, _ = model_and_batches(kind, num_layers=2, bidirectional=True)
    engine = make_engine(model, "auto")
    torch.testing.assert_close(engine.clipped_sum(TASK, batch, 1.0).norms, loop_norms(loop_gradients(model, batch)),
                               atol=1e-6, rtol=1e-6)
    assert isinstance(engine.engine, HookEngine)  # the exact rule served it: no fallback to vmap


def test_gru_hidden_bias_of_the_new_gate_is_scaled_by_the_reset_gate():
    """n = tanh(W_in x + b_in + r * (W_hn h + b_hn)): b_hn's gradient is r times b_in's, unlike LSTM's two biases."""
    model, batch, _ = model_and_batches("gru")
    per_sample = HookEngine(model).per_sample_gradients(TASK, batch)
    new_gate = slice(2 * HIDDEN, 3 * HIDDEN)
    b_in, b_hn = per_sample["recurrent.bias_ih_l0"][:, new_gate], per_sample["recurrent.bias_hh_l0"][:, new_gate]
    assert (b_hn - b_in).abs().max() > 1e-3
    torch.testing.assert_close(per_sample["recurrent.bias_ih_l0"][:, :new_gate.start],
                               per_sample["recurrent.bias_hh_l0"][:, :new_gate.start])


class CalledTwice(nn.Module):
    """One GRU applied to two halves of the sequence, the second from scratch: its gradient sums both calls."""

    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(FEATURES, HIDDEN, batch_first=True)
        self.head = nn.Linear(2 * HIDDEN, CLASSES)

    def forward(self, x):
        first, second = self.gru(x[:, :3])[1][-1], self.gru(x[:, 3:])[1][-1]
        return self.head(torch.cat([first, second], 1))


def test_a_recurrent_layer_called_twice_sums_both_calls():
    torch.manual_seed(0)
    model = CalledTwice().double()
    x = torch.randn(4, 6, FEATURES, dtype=torch.float64)
    batch = x, torch.tensor([0, 1, 2, 1])
    engine = HookEngine(model)
    reference = loop_gradients(model, batch)
    assert_matches_loop(engine.per_sample_gradients(TASK, batch), reference)
    torch.testing.assert_close(engine.clipped_sum(TASK, batch, 1.0).norms, loop_norms(reference))


class Configurable(nn.Module):
    """Calls its recurrent layer on a PackedSequence, with an initial state, or on one unbatched sequence."""

    def __init__(self, recurrent: nn.RNNBase, call: str = "plain"):
        super().__init__()
        self.recurrent, self.call = recurrent, call
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):
        if self.call == "packed":
            packed = pack_padded_sequence(x, torch.full((x.shape[0],), x.shape[1]), batch_first=True)
            return self.head(self.recurrent(packed)[1][-1])
        if self.call == "initial_state":
            state = torch.ones(self.recurrent.num_layers, x.shape[0], HIDDEN, dtype=x.dtype)
            return self.head(self.recurrent(x, state)[0][:, -1])
        if self.call == "unbatched":
            return self.head(self.recurrent(x[0])[0][-1:]).expand(x.shape[0], -1)
        return self.head(self.recurrent(x)[0][:, -1])


@pytest.mark.parametrize("layer", [nn.RNN, nn.GRU])
@pytest.mark.parametrize(("call", "message"), [("packed", "PackedSequence"), ("initial_state", "initial state"),
                                               ("unbatched", "batched")])
def test_calls_the_recompute_cannot_reproduce_are_refused(layer, call, message):
    model = Configurable(layer(FEATURES, HIDDEN, batch_first=True), call)
    batch = torch.randn(2, 5, FEATURES), torch.tensor([0, 1])
    with pytest.raises(UnsupportedModelError, match=f"{layer.__name__}.*{message}|{message}.*{layer.__name__}"):
        HookEngine(model).per_sample_gradients(TASK, batch)


@pytest.mark.parametrize("layer", [nn.RNN, nn.GRU])
def test_inter_layer_dropout_is_refused_while_training_only(layer):
    model = Configurable(layer(FEATURES, HIDDEN, num_layers=2, dropout=0.5, batch_first=True))
    batch = torch.randn(2, 5, FEATURES), torch.tensor([0, 1])
    with pytest.raises(UnsupportedModelError, match="dropout"):
        HookEngine(model).per_sample_gradients(TASK, batch)
    model.eval()
    gradients = HookEngine(model).per_sample_gradients(TASK, batch)
    assert gradients["recurrent.weight_hh_l1"].shape == (2, *model.recurrent.weight_hh_l1.shape)
