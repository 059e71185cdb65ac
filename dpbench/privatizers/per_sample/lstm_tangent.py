"""A forward-mode (jvp) rule for nn.LSTM, so JL keeps the fused kernel for the primal pass and its backward.

The fused LSTM kernels (oneDNN, cuDNN) have no forward-mode AD. Inside a forward-AD dual level,
`dual_lstm_forward` runs the native kernel on the primals (the autograd graph, and with it the fast fused
backward, is kept) and attaches tangents computed by the linearised recurrence, per direction in processing order:
    da_t = dW_ih x_t + W_ih dx_t + db + dW_hh h_{t-1} + W_hh dh_{t-1}
    dc_t = f_t dc_{t-1} + i_t(1-i_t) g_t da_i + f_t(1-f_t) c_{t-1} da_f + i_t(1-g_t^2) da_g
    dh_t = o_t(1-o_t) tanh(c_t) da_o + o_t (1 - tanh(c_t)^2) dc_t
The primal gates are recomputed from the kernel's output sequence (h_{t-1} is known for every t, so one batched
matmul per chunk of time steps), the cell states by an elementwise scan; only W_hh dh_{t-1} is sequential. Work
and memory stay O(chunk) beyond the kernel's own, which is what makes JL on an LSTM cost about one extra forward.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dpbench.errors import UnsupportedModelError
from dpbench.privatizers.per_sample.recurrent import check_recomputable

TIME_CHUNK = 8
"""Time steps whose gates and tangent inputs are held at once."""


def _times(start: int, stop: int, steps: int, directions: int, device: torch.device) -> Tensor:
    """(D, stop - start) time index of processing steps start..stop-1 in each direction (reverse runs T-1..0)."""
    forward = torch.arange(start, stop, device=device)
    return torch.stack([forward, steps - 1 - forward][:directions])


def _chunk_inputs(x: Tensor, output: Tensor, times: Tensor, hidden: int) -> Tensor:
    """[x_t, h_{t-1}, 1] (in processing order, zero before the first step) for a chunk: (D, t, B, in + H + 1); the
    ones column carries the bias through the same matmul."""
    steps = x.shape[1]
    parts = []
    for d, time in enumerate(times):
        previous_time = time - 1 if d == 0 else time + 1
        # advanced indexing copies only the chunk (index_select would first copy a non-contiguous kernel output)
        previous = output[:, previous_time.clamp(0, steps - 1), d * hidden : (d + 1) * hidden]
        previous = previous * ((previous_time >= 0) & (previous_time < steps)).to(x.dtype)[None, :, None]
        parts.append(torch.cat([x[:, time], previous, x.new_ones(x.shape[0], time.numel(), 1)], -1))
    return torch.stack(parts).transpose(1, 2)


def _driven(inputs: Tensor, tangent_matrix: Tensor, directions: int, count: int) -> Tensor:
    """[x_t, h_{t-1}, 1] @ [dW_ih, dW_hh, db]^T for `count` tangents at once: (D, t, B, F) -> (D, t, count, B, 4H)."""
    _, steps, batch, features = inputs.shape
    flat = torch.bmm(inputs.reshape(directions, steps * batch, features), tangent_matrix)
    return flat.view(directions, steps, batch, count, -1).transpose(2, 3)


@torch.no_grad()
def lstm_layer_tangents(
    x: Tensor, output: Tensor, weights: tuple[Tensor, Tensor, Tensor], dx: Tensor | None,
    tangents: tuple[Tensor, Tensor, Tensor],
) -> tuple[Tensor, Tensor, Tensor]:
    """Tangents of one LSTM layer (all its directions, batch first, zero initial state) for R tangents at once.

    x: (B, T, in) primal input; output: (B, T, D*H) the kernel's primal output; weights = (w_ih (D, 4H, in),
    w_hh (D, 4H, H), bias (D, 4H) = b_ih + b_hh) stacked over directions; tangents: the same with a leading R;
    dx: (R, B, T, in) input tangents or None. Returns d output (R, B, T, D*H), d h_n and d c_n (R, D, B, H).
    The primal gates are computed once and shared by the R tangents.
    """
    w_ih, w_hh, bias = weights
    dw_ih, dw_hh, dbias = tangents
    count = dw_ih.shape[0]
    directions, gates, hidden = w_hh.shape
    batch, steps, _ = x.shape
    primal_matrix = torch.cat([w_ih, w_hh, bias.unsqueeze(2)], 2).transpose(1, 2)
    tangent_matrix = torch.cat([dw_ih, dw_hh, dbias.unsqueeze(3)], 3).permute(1, 3, 0, 2).flatten(2)  # (D, F, R 4H)
    w_ih_t, w_hh_t = w_ih.transpose(1, 2), w_hh.transpose(1, 2)
    c = x.new_zeros(directions, batch, hidden)
    dh = x.new_zeros(directions, count * batch, hidden)
    dc = torch.zeros_like(dh)
    d_output = x.new_empty(count, batch, steps, directions * hidden)
    for start in range(0, steps, TIME_CHUNK):
        times = _times(start, min(start + TIME_CHUNK, steps), steps, directions, x.device)
        stacked = _chunk_inputs(x, output, times, hidden)
        chunk = stacked.shape[1]
        pre = torch.bmm(stacked.reshape(directions, chunk * batch, -1), primal_matrix)
        pre = pre.view(directions, chunk, batch, gates)
        g = pre[..., 2 * hidden : 3 * hidden].tanh()
        activated = pre.sigmoid_()  # in place: chunk-sized buffers dominate this rule's memory
        i, f, _, o = activated.chunk(4, dim=-1)
        c_prev, ig = torch.empty_like(g), i * g
        for t in range(chunk):
            c_prev[:, t] = c
            c = torch.addcmul(ig[:, t], f[:, t], c)
        tanh_c = torch.addcmul(ig, f, c_prev).tanh_()
        coefficients = torch.addcmul(activated, activated, activated, value=-1)  # sigmoid slopes, then in place:
        coefficients[..., :hidden].mul_(g)
        coefficients[..., hidden : 2 * hidden].mul_(c_prev)
        coefficients[..., 2 * hidden : 3 * hidden] = torch.addcmul(i, i, g.mul_(g), value=-1)
        coefficients[..., 3 * hidden :].mul_(tanh_c)
        coefficients = coefficients.unsqueeze(2)
        cell_to_hidden = torch.addcmul(o, o, tanh_c.mul_(tanh_c), value=-1).unsqueeze(2)
        f = f.unsqueeze(2)
        driven = _driven(stacked, tangent_matrix, directions, count)
        if dx is None:
            driven = driven.contiguous()
        else:
            moved = torch.stack([dx[:, :, time] for time in times]).permute(0, 3, 1, 2, 4)
            driven = torch.bmm(moved.reshape(directions, -1, dx.shape[-1]), w_ih_t).view(driven.shape).add_(driven)
        for t in range(chunk):
            da = torch.baddbmm(driven[:, t].view(directions, count * batch, gates), dh, w_hh_t)
            scaled = (coefficients[:, t] * da.view(directions, count, batch, gates)).view(
                directions, count, batch, 4, hidden)
            dc = torch.addcmul(scaled[..., :3, :].sum(-2), f[:, t], dc.view_as(scaled[..., 0, :])).flatten(1, 2)
            dh = torch.addcmul(scaled[..., 3, :], cell_to_hidden[:, t], dc.view_as(scaled[..., 0, :])).flatten(1, 2)
            for d, time in enumerate(times[:, t].tolist()):
                d_output[:, :, time, d * hidden : (d + 1) * hidden] = dh[d].view(count, batch, hidden)
    split = lambda state: state.view(directions, count, batch, hidden).transpose(0, 1)  # noqa: E731
    return d_output, split(dh), split(dc)


class _LayerTangents(torch.autograd.Function):
    """The tangent rule as one op with its own vmap rule: vmap over JL's directions hands it the physical (R, ...)
    tangents, so the recurrence runs once for all of them instead of batching each of its small ops."""

    @staticmethod
    def forward(x, output, w_ih, w_hh, bias, dx, dw_ih, dw_hh, dbias):  # noqa: ANN001, ANN205
        d_output, dh, dc = lstm_layer_tangents(
            x, output, (w_ih, w_hh, bias), None if dx is None else dx[None], (dw_ih[None], dw_hh[None], dbias[None]))
        return d_output[0], dh[0], dc[0]

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # noqa: ANN001
        """Only used without gradients (inside JL's no-grad jvp pass)."""

    @staticmethod
    def vmap(info, in_dims, x, output, w_ih, w_hh, bias, dx, dw_ih, dw_hh, dbias):  # noqa: ANN001, ANN205
        if any(dim is not None for dim in in_dims[:5]):
            raise UnsupportedModelError("the forward-mode nn.LSTM rule batches tangents only, not primal inputs")

        def leading(tensor: Tensor | None, dim: int | None) -> Tensor | None:
            if tensor is None:
                return None
            return tensor.expand(info.batch_size, *tensor.shape) if dim is None else tensor.movedim(dim, 0)

        tangents = tuple(leading(t, d) for t, d in zip((dw_ih, dw_hh, dbias), in_dims[6:], strict=True))
        outputs = lstm_layer_tangents(x, output, (w_ih, w_hh, bias), leading(dx, in_dims[5]), tangents)
        return outputs, (0, 0, 0)


Recorded = tuple[Tensor, Tensor, Tensor, Tensor]
"""A single-layer LSTM's input, output, h_n and c_n from the step's graph forward (reused as the primal)."""


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
    def forward(x, w_ih, w_hh, bias, training, recorded):  # noqa: ANN001, ANN205
        if recorded is not None and recorded[0].shape == x.shape and torch.equal(recorded[0], x):
            return recorded[1:]
        return _native_layer(x, w_ih, w_hh, bias, training)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # noqa: ANN001
        x, w_ih, w_hh, bias, _, _ = inputs
        ctx.save_for_forward(x, w_ih, w_hh, bias, output[0])

    @staticmethod
    def jvp(ctx, dx, dw_ih, dw_hh, dbias, *_):  # noqa: ANN001, ANN205
        x, w_ih, w_hh, bias, output = ctx.saved_tensors
        filled = [torch.zeros_like(p) if t is None else t for t, p in ((dw_ih, w_ih), (dw_hh, w_hh), (dbias, bias))]
        return _LayerTangents.apply(x, output, w_ih, w_hh, bias, dx, *filled)


def _stacked(module: nn.LSTM, layer: int) -> tuple[Tensor, Tensor, Tensor]:
    """(w_ih, w_hh, b_ih + b_hh) of a layer, stacked over its directions."""
    suffixes = [f"_l{layer}" + ("_reverse" if d else "") for d in range(2 if module.bidirectional else 1)]
    w_ih = torch.stack([getattr(module, "weight_ih" + s) for s in suffixes])
    w_hh = torch.stack([getattr(module, "weight_hh" + s) for s in suffixes])
    if module.bias:
        bias = torch.stack([getattr(module, "bias_ih" + s) + getattr(module, "bias_hh" + s) for s in suffixes])
    else:
        bias = w_hh.new_zeros(w_hh.shape[:2])
    return w_ih, w_hh, bias


def jvp_lstm_forward(
    module: nn.LSTM, x: Tensor, hx: tuple[Tensor, Tensor] | None = None, recorded: Recorded | None = None
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """nn.LSTM's forward for torch.func.jvp (and vmap over tangents): fused kernel, tangents by the rule above.

    `recorded` (single-layer LSTMs) is the same call's result from the graph forward, reused as the primal.
    """
    if hx is not None or not isinstance(x, Tensor):
        raise UnsupportedModelError("forward-mode nn.LSTM supports padded tensors and a zero initial state only")
    check_recomputable(module)
    layer_input = x if module.batch_first else x.transpose(0, 1)
    finals_h, finals_c = [], []
    for layer in range(module.num_layers):
        reuse = recorded if module.num_layers == 1 else None
        layer_input, h, c = _NativeLayer.apply(layer_input, *_stacked(module, layer), module.training, reuse)
        finals_h.append(h)
        finals_c.append(c)
    output = layer_input if module.batch_first else layer_input.transpose(0, 1)
    return output, (torch.cat(finals_h), torch.cat(finals_c))


def record_call(module: nn.LSTM, args: tuple, output: tuple) -> Recorded | None:
    """A forward hook's view of a call, batch first and detached, in the form `jvp_lstm_forward` reuses (None for
    calls it cannot reuse, e.g. a PackedSequence, which the jvp pass then refuses with a clear error)."""
    if not args or not isinstance(args[0], Tensor) or not isinstance(output[0], Tensor):
        return None
    x, (out, (h, c)) = args[0], output
    if not module.batch_first:
        x, out = x.transpose(0, 1), out.transpose(0, 1)
    return x.detach(), out.detach(), h.detach(), c.detach()
