"""Exact per-sample gradients of nn.RNN (tanh, relu), nn.GRU and nn.LSTM in the hook engine, against a per-example
loop in float64, and the refusals the recompute from the recorded input needs."""

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from dpbench.core.errors import UnsupportedModelError
from dpbench.core.tasks import ClassificationTask
from dpbench.privatizers.per_sample import HookEngine, make_engine
from tests.helpers.per_sample_reference import (
    assert_matches_loop,
    assert_only_the_replaced_norm_moves,
    loop_gradients,
    loop_norms,
)
from tests.helpers.recurrent_models import (
    CLASSES,
    CONFIGURATIONS,
    FEATURES,
    HIDDEN,
    KINDS,
    configuration_name,
    model_and_batches,
)

pytestmark = pytest.mark.models_as_built

TASK = ClassificationTask()


@pytest.mark.parametrize("options", CONFIGURATIONS, ids=configuration_name)
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
