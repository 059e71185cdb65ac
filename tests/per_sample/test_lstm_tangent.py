"""The forward-mode nn.LSTM rule JL uses: tangents against central finite differences of the native kernel (float64),
for every layout the rule accepts, batched over directions by vmap, with and without the recorded primal."""

import functools

import pytest
import torch
import torch.autograd.forward_ad as fwad
from torch import nn
from torch.func import functional_call, jvp, vmap

import dpbench.privatizers.per_sample.forward_mode.lstm as rule
from dpbench.core.errors import UnsupportedModelError
from dpbench.privatizers.per_sample.forward_mode.lstm import jvp_lstm_forward, mark_unread_outputs, record_call

LAYOUTS = [  # bidirectional, num_layers, batch_first, bias
    (True, 1, True, True),
    (False, 2, True, True),
    (True, 2, False, True),
    (False, 1, False, False),
]


def finite_difference(lstm, params, x, tangent, dx, eps=1e-6):
    def flat(values, inputs):
        out, (h, c) = functional_call(lstm, values, (inputs,))
        return torch.cat([out.flatten(), h.flatten(), c.flatten()])

    plus = {n: p + eps * tangent[n] for n, p in params.items()}
    minus = {n: p - eps * tangent[n] for n, p in params.items()}
    return (flat(plus, x + eps * dx) - flat(minus, x - eps * dx)) / (2 * eps)


@pytest.mark.parametrize(("bidirectional", "layers", "batch_first", "bias"), LAYOUTS)
@pytest.mark.parametrize("reuse", [False, True])
@pytest.mark.parametrize("time_chunk", [None, 3])  # 3: chunks carry the cell state over, and the last is partial
def test_tangents_match_finite_differences(monkeypatch, bidirectional, layers, batch_first, bias, reuse, time_chunk):
    if time_chunk is not None:
        monkeypatch.setattr(rule, "TIME_CHUNK", time_chunk)
    torch.manual_seed(0)
    lstm = nn.LSTM(5, 6, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first, bias=bias).double()
    x = torch.randn((4, 7, 5) if batch_first else (7, 4, 5), dtype=torch.float64)
    params = {n: p.detach() for n, p in lstm.named_parameters()}
    count = 3
    tangents = {n: torch.randn(count, *p.shape, dtype=torch.float64) for n, p in params.items()}
    input_tangents = torch.randn(count, *x.shape, dtype=torch.float64)
    with torch.no_grad():
        recorded = record_call(lstm, (x,), lstm(x)) if reuse else None
        lstm.forward = functools.partial(jvp_lstm_forward, lstm, recorded=recorded)
        try:
            batched = vmap(lambda v, d: jvp(lambda p, i: functional_call(lstm, p, (i,)), (params, x), (v, d))[1])(
                tangents, input_tangents)
        finally:
            del lstm.forward
        for j in range(count):
            got = torch.cat([batched[0][j].flatten(), batched[1][0][j].flatten(), batched[1][1][j].flatten()])
            expected = finite_difference(lstm, params, x, {n: t[j] for n, t in tangents.items()}, input_tangents[j])
            torch.testing.assert_close(got, expected, atol=1e-7, rtol=1e-6)


def test_primal_is_the_native_result_and_stale_records_are_not_reused():
    torch.manual_seed(1)
    lstm = nn.LSTM(3, 4, batch_first=True)
    x = torch.randn(2, 5, 3)
    with torch.no_grad():
        expected = lstm(x)
        stale = record_call(lstm, (x + 1,), lstm(x + 1))  # recorded for another input: must be recomputed
        output, (h, c) = jvp_lstm_forward(lstm, x, recorded=stale)
    torch.testing.assert_close(output, expected[0])
    torch.testing.assert_close(h, expected[1][0])
    torch.testing.assert_close(c, expected[1][1])


def test_initial_state_and_projections_are_refused():
    lstm = nn.LSTM(3, 4, batch_first=True)
    x = torch.randn(2, 5, 3)
    with pytest.raises(UnsupportedModelError, match="initial state"):
        jvp_lstm_forward(lstm, x, (torch.zeros(1, 2, 4), torch.zeros(1, 2, 4)))
    with pytest.raises(UnsupportedModelError, match="proj_size"):
        jvp_lstm_forward(nn.LSTM(3, 4, proj_size=2), x)


def test_a_matching_record_replaces_the_kernel_call(monkeypatch):
    calls = []
    native = rule._native_layer
    monkeypatch.setattr(rule, "_native_layer", lambda *args: calls.append(1) or native(*args))
    lstm = nn.LSTM(3, 4, batch_first=True, bidirectional=True)
    x = torch.randn(2, 5, 3)
    with torch.no_grad():
        recorded = record_call(lstm, (x,), lstm(x))
        jvp_lstm_forward(lstm, x, recorded=recorded)
        assert not calls
        jvp_lstm_forward(lstm, x)
        assert len(calls) == 1
    assert record_call(lstm, (torch.nn.utils.rnn.pack_sequence([x[0], x[1]]),), lstm(x)) is None


@pytest.mark.parametrize(("bidirectional", "batch_first"), [(True, True), (False, False)])
@pytest.mark.parametrize("reads_output", [False, True])
def test_the_loss_graph_tells_whether_the_output_sequence_is_read(bidirectional, batch_first, reads_output):
    """Unidirectional batch-second calls return the kernel node's own output, which h_n shares: the edge, not the
    node, must decide."""
    torch.manual_seed(2)
    lstm = nn.LSTM(3, 4, bidirectional=bidirectional, batch_first=batch_first)
    x = torch.randn((2, 5, 3) if batch_first else (5, 2, 3))
    out, (h, c) = lstm(x)
    losses = out.sum((0, 2)) if reads_output else h.sum((0, 2))
    recorded = {lstm: record_call(lstm, (x,), (out, (h, c)))}
    mark_unread_outputs(recorded, losses)
    assert recorded[lstm].output_used == reads_output


def test_an_output_without_autograd_history_counts_as_read():
    """Reentrant checkpointing runs the forward without grad and recomputes it in the backward: no edge is no
    evidence that the loss ignores the output."""
    lstm = nn.LSTM(3, 4, batch_first=True)
    x = torch.randn(2, 5, 3)
    with torch.no_grad():
        recorded = {lstm: record_call(lstm, (x,), lstm(x))}
    out, (h, _) = lstm(x)
    mark_unread_outputs(recorded, h.sum((0, 2)))
    assert recorded[lstm].output_used


def test_an_unread_output_gets_no_tangent_and_the_final_states_keep_theirs():
    torch.manual_seed(3)
    lstm = nn.LSTM(3, 4, batch_first=True, bidirectional=True).double()
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    params = {n: p.detach() for n, p in lstm.named_parameters()}
    tangents = {n: torch.randn_like(p) for n, p in params.items()}
    with torch.no_grad():
        recorded = record_call(lstm, (x,), lstm(x))
    results = {}
    for used in (True, False):
        lstm.forward = functools.partial(jvp_lstm_forward, lstm, recorded=recorded._replace(output_used=used))
        try:
            with torch.no_grad(), fwad.dual_level():
                duals = {n: fwad.make_dual(p, tangents[n]) for n, p in params.items()}
                out, (h, c) = functional_call(lstm, duals, (x,))
                results[used] = [fwad.unpack_dual(t).tangent for t in (out, h, c)]
        finally:
            del lstm.forward
    assert results[False][0] is None and results[True][0] is not None
    torch.testing.assert_close(results[False][1], results[True][1], rtol=0, atol=0)
    torch.testing.assert_close(results[False][2], results[True][2], rtol=0, atol=0)
