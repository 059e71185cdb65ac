"""The functorch engine on models the hooks cannot serve: recurrent layers (float64 included), Hugging Face text models
given attention masks with padding, and models vmap cannot trace at all; exact against a per-example loop."""

import logging

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from dpbench.core.errors import UnsupportedModelError
from dpbench.core.tasks import ClassificationTask
from dpbench.privatizers.per_sample import FunctorchEngine
from tests.helpers.per_sample_reference import assert_matches_loop, check_exact, loop_gradients

TASK = ClassificationTask()
FEATURES, HIDDEN, CLASSES = 3, 4, 3
LOGGER = "dpbench.privatizers.per_sample.functorch"


class Recurrent(nn.Module):
    """A recurrent layer with a learned initial state (which the hook rules refuse), reading every output."""

    def __init__(self, layer: type[nn.RNNBase], initial_state: bool, **options):
        super().__init__()
        self.recurrent = layer(FEATURES, HIDDEN, **options)
        directions = 2 if self.recurrent.bidirectional else 1
        width = self.recurrent.proj_size or HIDDEN
        states = 2 if isinstance(self.recurrent, nn.LSTM) else 1
        self.initial = nn.Parameter(0.5 * torch.randn(self.recurrent.num_layers * directions, 1, width)) \
            if initial_state else None
        self.head = nn.Linear(width * directions + width + HIDDEN * (states - 1), CLASSES)

    def forward(self, x):
        time = 1 if self.recurrent.batch_first else 0
        if not self.recurrent.batch_first:
            x = x.transpose(0, 1)
        if self.initial is None:
            output, state = self.recurrent(x)
        else:
            h0 = self.initial.expand(-1, x.shape[1 - time], -1)
            hx = (h0, torch.tanh(h0[..., :1]).expand(-1, -1, HIDDEN).contiguous()) \
                if isinstance(self.recurrent, nn.LSTM) else h0
            output, state = self.recurrent(x, hx)
        finals = [state[-1]] if isinstance(state, torch.Tensor) else [s[-1] for s in state]
        return self.head(torch.cat([torch.tanh(output).mean(time), *finals], 1))


def recurrent_batches(size: int = 5, seed: int = 1):
    generator = torch.Generator().manual_seed(seed)

    def batch():
        return (torch.randn(size, 6, FEATURES, generator=generator, dtype=torch.float64),
                torch.randint(0, CLASSES, (size,), generator=generator))

    return batch(), batch()


RECURRENT = {
    "rnn_tanh_two_layers_bidirectional": (nn.RNN, {"num_layers": 2, "bidirectional": True, "batch_first": True}),
    "rnn_relu_time_major_no_bias": (nn.RNN, {"nonlinearity": "relu", "bias": False}),
    "gru_two_layers_bidirectional_time_major": (nn.GRU, {"num_layers": 2, "bidirectional": True}),
    "gru_no_bias": (nn.GRU, {"bias": False, "batch_first": True}),
    "lstm_two_layers_bidirectional": (nn.LSTM, {"num_layers": 2, "bidirectional": True, "batch_first": True}),
    "lstm_projections_time_major": (nn.LSTM, {"proj_size": 2, "num_layers": 2}),
}


@pytest.mark.parametrize("initial_state", [False, True], ids=["zero_state", "learned_state"])
@pytest.mark.parametrize("case", sorted(RECURRENT))
def test_recurrent_layers_in_float64_match_a_per_example_loop(case, initial_state):
    layer, options = RECURRENT[case]
    torch.manual_seed(0)
    model = Recurrent(layer, initial_state, **options).double()
    check_exact(model, *recurrent_batches())


class Unbatched(nn.Module):
    """Runs its recurrent layer on one unbatched (T, F) sequence at a time, from a learned initial state."""

    def __init__(self, layer: type[nn.RNNBase]):
        super().__init__()
        self.recurrent = layer(FEATURES, HIDDEN, num_layers=2)
        self.initial = nn.Parameter(0.5 * torch.randn(2, HIDDEN))
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):
        hx = (self.initial, torch.tanh(self.initial)) if isinstance(self.recurrent, nn.LSTM) else self.initial
        return self.head(torch.stack([self.recurrent(sequence, hx)[0][-1] for sequence in x]))


@pytest.mark.parametrize("layer", [nn.GRU, nn.LSTM])
def test_unbatched_calls_match_a_per_example_loop(layer):
    torch.manual_seed(0)
    check_exact(Unbatched(layer).double(), *recurrent_batches())


def test_recurrent_layers_are_restored_after_the_engine_ran():
    torch.manual_seed(0)
    model = Recurrent(nn.GRU, False, batch_first=True).double()
    batch, _ = recurrent_batches()
    FunctorchEngine(model).per_sample_gradients(TASK, batch)
    assert "forward" not in vars(model.recurrent)  # the fused kernel serves every other caller


class Packed(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.GRU(FEATURES, HIDDEN, batch_first=True)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):
        packed = pack_padded_sequence(x, torch.full((x.shape[0],), x.shape[1]), batch_first=True)
        return self.head(self.encoder(packed)[1][-1])


def test_packed_sequences_are_refused_naming_the_layer():
    batch, _ = recurrent_batches()
    with pytest.raises(UnsupportedModelError, match=r"encoder \(GRU\).*PackedSequence"):
        FunctorchEngine(Packed().double()).per_sample_gradients(TASK, batch)


def test_inter_layer_dropout_is_applied_per_sample_while_training():
    torch.manual_seed(0)
    model = Recurrent(nn.GRU, False, num_layers=2, dropout=0.5, batch_first=True).double()
    batch, _ = recurrent_batches()
    engine = FunctorchEngine(model)
    training = engine.per_sample_gradients(TASK, batch)["recurrent.weight_hh_l0"]
    model.eval()
    evaluation = engine.per_sample_gradients(TASK, batch)["recurrent.weight_hh_l0"]
    assert_matches_loop(engine.per_sample_gradients(TASK, batch), loop_gradients(model, batch))
    assert not torch.allclose(training, evaluation)


class DataDependent(nn.Module):
    """Branches on the value of its input: vmap cannot trace it, a per-example loop can."""

    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(FEATURES, CLASSES), nn.Linear(FEATURES, CLASSES)

    def forward(self, x):
        return self.first(x) if x.sum() > 0 else torch.tanh(self.second(x))


def test_a_model_vmap_cannot_trace_falls_back_to_an_exact_per_example_loop(caplog):
    torch.manual_seed(0)
    model = DataDependent().double()
    generator = torch.Generator().manual_seed(3)
    batch = torch.randn(6, FEATURES, generator=generator, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1, 2])
    other = -batch[0], batch[1]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        check_exact(model, batch, other, looped=True)
    assert "vmap cannot trace DataDependent" in caplog.text and "per-example loop" in caplog.text


class Broken(nn.Module):
    def forward(self, x):
        return x @ torch.ones(FEATURES + 1, CLASSES, dtype=x.dtype)


def test_an_error_the_loop_meets_too_is_raised():
    batch = torch.randn(2, FEATURES, dtype=torch.float64), torch.tensor([0, 1])
    model = nn.Sequential(nn.Linear(FEATURES, FEATURES), Broken()).double()
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        FunctorchEngine(model).per_sample_gradients(TASK, batch)
