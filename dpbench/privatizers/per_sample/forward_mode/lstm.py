"""A forward-mode (jvp) rule for nn.LSTM, so JL keeps the fused kernel for the primal pass and its backward.

The fused LSTM kernels (oneDNN, cuDNN) have no forward-mode AD. Inside JL's jvp pass, `jvp_lstm_forward` takes the
primal from the graph forward's recorded kernel call (or runs the kernel) and attaches tangents computed by the
linearised recurrence, per direction in processing order:
    da_t = dW_ih x_t + W_ih dx_t + db + dW_hh h_{t-1} + W_hh dh_{t-1}
    dc_t = f_t dc_{t-1} + i_t(1-i_t) g_t da_i + f_t(1-f_t) c_{t-1} da_f + i_t(1-g_t^2) da_g
    dh_t = o_t(1-o_t) tanh(c_t) da_o + o_t (1 - tanh(c_t)^2) dc_t
The primal gates are recomputed from the kernel's output sequence (h_{t-1} is known for every t, so one batched
matmul per chunk of time steps), the cell states by an elementwise scan; only W_hh dh_{t-1} is sequential. Memory
stays O(chunk) beyond the kernel's own; the work is about the kernel's forward and backward together, a third of
it the gate recompute that the kernel's hidden workspace forces. When the graph forward's loss does not read the
output sequence (a classifier on h_n), that sequence gets no tangent: the rule writes only d h_n and d c_n.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from dpbench.core.errors import UnsupportedModelError
from dpbench.privatizers.per_sample.base import graph_nodes
from dpbench.privatizers.per_sample.forward_mode.batching import directions_first
from dpbench.privatizers.per_sample.rnn_recompute import check_recomputable, stacked_layer_weights

TIME_CHUNK = 4
"""Time steps whose gates and tangent inputs are held at once: 4 keeps JL r=1 on the BiLSTM (batch 64, length 150)
at 1.15x non-private's working set, 16 took 1.26x, at the same step time (BENCHMARKS.md, issue 48)."""

sigmoid_slope = torch.ops.aten.sigmoid_backward.grad_input
tanh_slope = torch.ops.aten.tanh_backward.grad_input


def _ordered(sequence: Tensor, direction: int, start: int, stop: int) -> Tensor:
    """Processing steps start..stop-1 of a (B, T, F) sequence, in the order the direction runs (reverse: T-1..0)."""
    steps = sequence.shape[1]
    return sequence[:, start:stop] if direction == 0 else sequence[:, steps - stop : steps - start].flip(1)


@torch.no_grad()
def lstm_layer_tangents(
    x: Tensor, output: Tensor, weights: tuple[Tensor, Tensor, Tensor], dx: Tensor | None,
    tangents: tuple[Tensor, Tensor, Tensor], with_output: bool = True,
) -> tuple[Tensor | None, Tensor, Tensor]:
    """Tangents of one LSTM layer (all its directions, batch first, zero initial state) for R tangents at once.

    x: (B, T, in) primal input; output: (B, T, D*H) the kernel's primal output; weights = (w_ih (D, 4H, in),
    w_hh (D, 4H, H), bias (D, 4H) = b_ih + b_hh) stacked over directions; tangents: the same with a leading R;
    dx: (R, B, T, in) input tangents or None. Returns d output (R, B, T, D*H; None without `with_output`), d h_n
    and d c_n (R, D, B, H). d output is laid out time-major like the fused kernels' batch-first output, so forward
    AD takes it as it is. The primal gates are computed once and shared by the R tangents; per time step only the
    recurrence runs, for all directions and tangents in one batched op each (tangent rows sample-major, (B, R)).
    One function, longer than most: the recurrence's state (gates, cells, their tangents) lives across its loop.
    """
    w_ih, w_hh, bias = weights
    dw_ih, dw_hh, dbias = tangents
    count = dw_ih.shape[0]
    directions, gates, hidden = w_hh.shape
    batch, steps, features = x.shape
    primal_matrix = torch.cat([w_ih, w_hh, bias.unsqueeze(2)], 2).transpose(1, 2).contiguous()  # (D, F, 4H)
    tangent_matrix = torch.cat([dw_ih, dw_hh, dbias.unsqueeze(3)], 3).permute(1, 3, 0, 2).flatten(2)  # (D, F, R 4H)
    w_ih_t, w_hh_t = w_ih.transpose(1, 2), w_hh.transpose(1, 2)
    chunk_size = min(TIME_CHUNK, steps)
    inputs = x.new_empty(directions, chunk_size, batch, features + hidden + 1)  # [x_t, h_{t-1}, 1] per step
    inputs[..., -1] = 1
    moved = None if dx is None else x.new_empty(directions, chunk_size, batch, count, features)
    cells = x.new_zeros(directions, chunk_size + 1, batch, hidden)  # primal c_{t-1}, c_t of the chunk's steps
    d_hidden = x.new_empty(directions, chunk_size, batch, count, hidden)
    slopes = x.new_empty(directions, chunk_size, batch, gates)
    cell_to_hidden_buffer = x.new_empty(directions, chunk_size, batch, hidden)
    dh = x.new_zeros(directions, batch * count, hidden)
    dc = x.new_zeros(directions, batch, count, hidden)
    d_sequence = x.new_empty(count, steps, batch, directions * hidden) if with_output else None
    for start in range(0, steps, chunk_size):
        stop = min(start + chunk_size, steps)
        chunk = stop - start
        for d in range(directions):
            inputs[d, :chunk, :, :features] = _ordered(x, d, start, stop).transpose(0, 1)
            previous = _ordered(output[..., d * hidden : (d + 1) * hidden], d, max(start - 1, 0), stop - 1)
            inputs[d, chunk - previous.shape[1] : chunk, :, features:-1] = previous.transpose(0, 1)
            if start == 0:
                inputs[d, 0, :, features:-1] = 0
            if dx is not None:  # (R, B, t, in) -> (t, B, R, in), slicing before any copy
                in_order = dx[:, :, start:stop] if d == 0 else dx[:, :, steps - stop : steps - start].flip(2)
                moved[d, :chunk] = in_order.permute(2, 1, 0, 3)
        stacked = inputs[:, :chunk].reshape(directions, chunk * batch, -1)
        pre = torch.bmm(stacked, primal_matrix).view(directions, chunk, batch, gates)
        i, f, g, o = pre.chunk(4, dim=-1)  # activated in place: chunk-sized buffers dominate this rule's memory
        pre[..., : 2 * hidden].sigmoid_()
        g.tanh_()
        o.sigmoid_()
        coefficients = slopes[:, :chunk]
        # d a -> d c and d h slopes, each one fused op: sigmoid_backward(v, s) = v s (1 - s), tanh_backward(v, t) =
        # v (1 - t^2)
        sigmoid_slope(g, i, grad_input=coefficients[..., :hidden])
        tanh_slope(i, g, grad_input=coefficients[..., 2 * hidden : 3 * hidden])
        ig = i.mul_(g)
        cells[:, 0] = cells[:, chunk_size if start else 0]
        c_prev, c_next = cells[:, :chunk], cells[:, 1 : chunk + 1]
        for ig_t, f_t, c_prev_t, c_t in zip(ig.unbind(1), f.unbind(1), c_prev.unbind(1), c_next.unbind(1), strict=True):
            torch.addcmul(ig_t, f_t, c_prev_t, out=c_t)
        tanh_c = c_next.tanh()
        sigmoid_slope(c_prev, f, grad_input=coefficients[..., hidden : 2 * hidden])
        sigmoid_slope(tanh_c, o, grad_input=coefficients[..., 3 * hidden :])
        cell_to_hidden = tanh_slope(o, tanh_c, grad_input=cell_to_hidden_buffer[:, :chunk])
        driven = torch.bmm(stacked, tangent_matrix)  # (D, t B, R 4H) = (D, t, B, R, 4H)
        if dx is not None:
            driven.view(directions, -1, gates).baddbmm_(moved[:, :chunk].reshape(directions, -1, features), w_ih_t)
        per_step = zip(
            driven.view(directions, chunk, batch * count, gates).unbind(1),
            coefficients.unflatten(-1, (1, 4, hidden)).unbind(1),  # broadcast over the tangents
            f.unsqueeze(3).unbind(1), cell_to_hidden.unsqueeze(3).unbind(1), d_hidden[:, :chunk].unbind(1),
            strict=True,
        )
        for driven_t, coefficients_t, f_t, cell_to_hidden_t, d_hidden_t in per_step:
            scaled = driven_t.baddbmm_(dh, w_hh_t).view(directions, batch, count, 4, hidden).mul_(coefficients_t)
            from_i, from_f, from_g, from_o = scaled.unbind(3)
            dc = torch.addcmul(from_i, f_t, dc).add_(from_f).add_(from_g)
            torch.addcmul(from_o, cell_to_hidden_t, dc, out=d_hidden_t)
            dh = d_hidden_t.view(directions, batch * count, hidden)
        for d in range(directions if d_sequence is not None else 0):
            ordered = d_hidden[d, :chunk] if d == 0 else d_hidden[d, :chunk].flip(0)
            times = slice(start, stop) if d == 0 else slice(steps - stop, steps - start)
            d_sequence[:, times, :, d * hidden : (d + 1) * hidden] = ordered.permute(2, 0, 1, 3)
    split = lambda state: state.reshape(directions, batch, count, hidden).permute(2, 0, 1, 3)  # noqa: E731
    return None if d_sequence is None else d_sequence.transpose(1, 2), split(dh), split(dc)


class _LayerTangents(torch.autograd.Function):
    """The tangent rule as one op with its own vmap rule: vmap over JL's directions hands it the physical (R, ...)
    tangents, so the recurrence runs once for all of them instead of batching each of its small ops."""

    @staticmethod
    def forward(x, output, w_ih, w_hh, bias, dx, dw_ih, dw_hh, dbias, with_output):  # noqa: ANN001, ANN205
        d_output, dh, dc = lstm_layer_tangents(
            x, output, (w_ih, w_hh, bias), None if dx is None else dx[None], (dw_ih[None], dw_hh[None], dbias[None]),
            with_output)
        return None if d_output is None else d_output[0], dh[0], dc[0]

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # noqa: ANN001
        """Only used without gradients (inside JL's no-grad jvp pass)."""

    @staticmethod
    def vmap(info, in_dims, x, output, w_ih, w_hh, bias, dx, dw_ih, dw_hh, dbias, with_output):  # noqa: ANN001, ANN205
        if any(dim is not None for dim in in_dims[:5]):
            raise UnsupportedModelError("the forward-mode nn.LSTM rule batches tangents only, not primal inputs")
        count = info.batch_size
        tangents = tuple(directions_first(t, d, count) for t, d in zip((dw_ih, dw_hh, dbias), in_dims[6:9],
                                                                         strict=True))
        outputs = lstm_layer_tangents(x, output, (w_ih, w_hh, bias), directions_first(dx, in_dims[5], count),
                                      tangents, with_output)
        return outputs, (0 if with_output else None, 0, 0)


class Recorded(NamedTuple):
    """An nn.LSTM's calls in the step's graph forward. The last call's tensors are reused as the jvp pass's primal
    (single-layer modules, when the input matches); the output sequences' autograd edges, one per call, answer
    whether the loss reads any of them (a classifier on h_n does not: the top layer's output then gets no tangent).
    """

    input: Tensor
    output: Tensor
    h: Tensor
    c: Tensor
    output_edges: tuple[tuple[object, int] | None, ...]
    output_used: bool = True


def _native_layer(x: Tensor, w_ih: Tensor, w_hh: Tensor, bias: Tensor, training: bool) -> tuple[Tensor, ...]:
    """One layer, all directions, on the fused kernel (zero initial state, batch first)."""
    directions, _, hidden = w_hh.shape
    flat = []
    for d in range(directions):
        flat.extend([w_ih[d], w_hh[d], bias[d], torch.zeros_like(bias[d])])
    zeros = x.new_zeros(directions, x.shape[0], hidden)
    output, h, c = torch.lstm(x, (zeros, zeros), flat, True, 1, 0.0, training, directions == 2, True)
    return output, h, c


class _NativeLayer(torch.autograd.Function):
    """The fused kernel's forward (or the graph forward's recorded result) with the tangent rule as its jvp."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, w_ih, w_hh, bias, training, recorded, with_output):  # noqa: ANN001, ANN205
        if recorded is not None and recorded.input.shape == x.shape and torch.equal(recorded.input, x):
            return recorded.output, recorded.h, recorded.c
        return _native_layer(x, w_ih, w_hh, bias, training)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # noqa: ANN001
        x, w_ih, w_hh, bias, _, _, with_output = inputs
        ctx.with_output = with_output
        if not with_output:  # nothing reads it: it carries no tangent
            ctx.mark_non_differentiable(output[0])
        ctx.save_for_forward(x, w_ih, w_hh, bias, output[0])

    @staticmethod
    def jvp(ctx, dx, dw_ih, dw_hh, dbias, *_):  # noqa: ANN001, ANN205
        x, w_ih, w_hh, bias, output = ctx.saved_tensors
        filled = [torch.zeros_like(p) if t is None else t for t, p in ((dw_ih, w_ih), (dw_hh, w_hh), (dbias, bias))]
        return _LayerTangents.apply(x, output, w_ih, w_hh, bias, dx, *filled, ctx.with_output)


def jvp_lstm_forward(
    module: nn.LSTM, x: Tensor, hx: tuple[Tensor, Tensor] | None = None, recorded: Recorded | None = None
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """nn.LSTM's forward for torch.func.jvp (and vmap over tangents): fused kernel, tangents by the rule above.

    `recorded` is the same call from the graph forward: for single-layer LSTMs its result is reused as the primal,
    and its `output_used` says whether the top layer's output sequence needs a tangent.
    """
    if hx is not None or not isinstance(x, Tensor):
        raise UnsupportedModelError("forward-mode nn.LSTM supports padded tensors and a zero initial state only")
    check_recomputable(module)
    layer_input = x if module.batch_first else x.transpose(0, 1)
    finals_h, finals_c = [], []
    for layer in range(module.num_layers):
        reuse = recorded if module.num_layers == 1 else None
        top = layer == module.num_layers - 1
        with_output = not top or recorded is None or recorded.output_used
        weights = stacked_layer_weights(module, layer)
        layer_input, h, c = _NativeLayer.apply(layer_input, *weights, module.training, reuse, with_output)
        finals_h.append(h)
        finals_c.append(c)
    output = layer_input if module.batch_first else layer_input.transpose(0, 1)
    return output, (torch.cat(finals_h), torch.cat(finals_c))


def record_call(module: nn.LSTM, args: tuple, output: tuple, earlier: Recorded | None = None) -> Recorded | None:
    """A forward hook's view of a call, batch first and detached, in the form `jvp_lstm_forward` reuses (None for
    calls it cannot reuse, e.g. a PackedSequence, which the jvp pass then refuses with a clear error). `earlier`,
    the module's record from a previous call in the same forward, passes on its output edges."""
    if not args or not isinstance(args[0], Tensor) or not isinstance(output[0], Tensor):
        return None
    x, (out, (h, c)) = args[0], output
    edge = None if out.grad_fn is None else (out.grad_fn, out.output_nr)
    if not module.batch_first:
        x, out = x.transpose(0, 1), out.transpose(0, 1)
    edges = (*(() if earlier is None else earlier.output_edges), edge)
    return Recorded(x.detach(), out.detach(), h.detach(), c.detach(), edges)


def _edges_into(losses: Tensor) -> set[tuple[object, int]]:
    """Every (node, output index) the autograd graph of `losses` takes a gradient into."""
    return {edge for node in graph_nodes(losses) for edge in node.next_functions}


def mark_unread_outputs(recorded: dict[nn.Module, Recorded | None], losses: Tensor) -> None:
    """Flag the modules none of whose output sequences the losses depend on through differentiable ops (the only
    ones that carry a tangent too): their jvp skips the top layer's output tangent. An output with no autograd
    edge counts as read: under a no-grad forward (reentrant checkpointing) the backward recomputes it."""
    reached = _edges_into(losses)
    for module, call in recorded.items():
        if call is not None:
            used = any(edge is None or edge in reached for edge in call.output_edges)
            recorded[module] = call._replace(output_used=used)
