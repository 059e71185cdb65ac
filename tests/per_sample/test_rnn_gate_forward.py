"""Issue 26: the hook engine's recurrent layers take their gate gradients from the step's one backward
(rnn_gate_forward.py), exactly: against a per-example loop and against autograd through the written-out recurrence,
in float64, with the second pass over the recurrence made impossible."""

import pytest
import torch
from torch import nn

from dpbench.core.errors import UnsupportedModelError
from dpbench.core.tasks import ClassificationTask
from dpbench.privatizers.per_sample import HookEngine, rnn_recompute
from dpbench.privatizers.per_sample.rnn_gate_forward import Recurrence
from dpbench.privatizers.per_sample.rnn_unrolled import LayerWeights, run_layer
from tests.helpers.per_sample_reference import assert_matches_loop, loop_gradients, loop_norms
from tests.helpers.recurrent_models import CONFIGURATIONS, KINDS, configuration_name, model_and_batches

pytestmark = pytest.mark.models_as_built

TASK = ClassificationTask()

MODES = {"rnn_tanh": "RNN_TANH", "rnn_relu": "RNN_RELU", "gru": "GRU", "lstm": "LSTM"}


@pytest.fixture
def no_second_pass(monkeypatch):
    """The recompute rule's recurrence raises: only the main backward can give the gate gradients."""
    def refuse(*args, **kwargs):
        raise AssertionError("the recurrence was run a second time")

    monkeypatch.setattr(rnn_recompute, "run_layer", refuse)


@pytest.mark.parametrize("options", CONFIGURATIONS, ids=configuration_name)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_gate_gradients_from_the_main_backward_match_a_per_example_loop(kind, options, no_second_pass):
    model, batch, _ = model_and_batches(kind, **options)
    engine = HookEngine(model)
    reference = loop_gradients(model, batch)
    assert_matches_loop(engine.per_sample_gradients(TASK, batch), reference)
    norms = loop_norms(reference)
    clipped = engine.clipped_sum(TASK, batch, float(norms.median()))
    torch.testing.assert_close(clipped.norms, norms, atol=1e-9, rtol=1e-9)
    factors = (float(norms.median()) / (norms + 1e-6)).clamp(max=1.0)
    for name, grad in clipped.grads.items():
        expected = sum(f * sample[name] for f, sample in zip(factors, reference, strict=True))
        torch.testing.assert_close(grad, expected, atol=1e-9, rtol=1e-9)
    assert "forward" not in vars(model.recurrent)  # the engine put the module's own forward back


@pytest.mark.parametrize("kind", sorted(MODES))
def test_the_recurrence_backward_is_autograd_through_the_written_out_recurrence(kind):
    torch.manual_seed(0)
    mode, count, batch, steps, hidden = MODES[kind], 2, 3, 5, 4
    width = {"LSTM": 4, "GRU": 3}.get(mode, 1) * hidden
    gates = torch.randn(count, batch, steps, width, dtype=torch.float64, requires_grad=True)
    w_hh = torch.randn(count, width, hidden, dtype=torch.float64)
    b_hh = torch.randn(count, width, dtype=torch.float64)
    outputs, h, c, _ = Recurrence.apply(mode, gates, w_hh, b_hh)
    weights = LayerWeights(None, w_hh, None, b_hh, None)
    zeros = torch.zeros(count, batch, hidden, dtype=torch.float64)
    run = run_layer(mode, gates, weights, zeros, zeros if mode == "LSTM" else None)
    torch.testing.assert_close(outputs, run.outputs)
    weights_out = [torch.randn_like(t) for t in (outputs, h)]
    ours = (weights_out[0] * outputs).sum() + (weights_out[1] * h).sum()
    theirs = (weights_out[0] * run.outputs).sum() + (weights_out[1] * run.h).sum()
    if mode == "LSTM":
        weight_c = torch.randn_like(c)
        ours, theirs = ours + (weight_c * c).sum(), theirs + (weight_c * run.c).sum()
    got, = torch.autograd.grad(ours, gates)
    expected, = torch.autograd.grad(theirs, gates)
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-10)


def test_a_module_with_a_forward_of_its_own_is_not_served_by_the_hooks():
    """A forward set on the instance is code dpbench has not proven per-sample (construction.py): the hooks refuse
    it, naming the module, and leave it in place."""
    model, batch, _ = model_and_batches("lstm", num_layers=2, bidirectional=True)
    lstm = model.recurrent
    lstm.forward = lambda *args, **kwargs: nn.LSTM.forward(lstm, *args, **kwargs)
    with pytest.raises(UnsupportedModelError, match="recurrent.*forward replaced on the instance"):
        HookEngine(model)
    assert "forward" in vars(lstm)
