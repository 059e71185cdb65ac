"""nn.RNN, nn.GRU and nn.LSTM run by the hook engine's own recurrence, so the gate gradients come from the main
backward instead of a second pass over the recurrence.

While the hook engine records a forward, each eligible recurrent layer runs `gate_forward`: its input gates
G = W_ih x + b are formed with ordinary autograd ops and the recurrence runs in `Recurrence`, an autograd function
whose backward is the layer's back-propagation through time written out (one batched matmul per step). The engine
asks the one backward it already runs for dL/dG at G, and forms every weight's sites from G's gradient and the
states the forward kept (rnn_recompute.py, `gate_sites`). The recurrence's backward returns no weight gradient (W_hh
enters detached): the hook engine reads none from autograd; every per-sample gradient comes from the sites.
What the fused kernel does and this cannot reproduce (an initial state, projections, inter-layer dropout while
training, packed sequences, another forward set on the module) runs the kernel, and the recompute rule or its
refusal applies.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from dpbench.privatizers.per_sample.rnn_unrolled import (
    directional_inputs,
    directions,
    input_gates,
    joined_outputs,
    layer_weights,
)


class GateRecord(NamedTuple):
    """What one call kept for its sites, per layer: inputs (D, B, T, in) and previous states (D, B, T, H) in each
    direction's processing order, GRU's reset gates (D, B, T, H) or None."""

    batch: int
    inputs: list[Tensor]
    previous: list[Tensor]
    resets: list[Tensor | None]


def eligible(module: nn.RNNBase, args: tuple, kwargs: dict) -> bool:
    """Whether `gate_forward` computes what the module's own forward would, for this call."""
    x = args[0] if args else kwargs.get("input")
    hx = args[1] if len(args) > 1 else kwargs.get("hx")
    return (isinstance(x, Tensor) and x.dim() == 3 and x.shape[1 if module.batch_first else 0] > 0 and hx is None
            and not module.proj_size and not (module.training and module.dropout > 0 and module.num_layers > 1))


def _shifted(states: Tensor) -> Tensor:
    """(D, B, T, H) -> the state each step started from: zeros, then states up to T-1."""
    return torch.cat([torch.zeros_like(states[:, :, :1]), states[:, :, :-1]], dim=2)


class Recurrence(torch.autograd.Function):
    """(D, B, T, G*H) input gates -> outputs (D, B, T, H), h_n (D, B, H), c_n (D, B, H; LSTM, else empty) and GRU's
    reset gates (D, B, T, H; else empty, not differentiable), from zero states. Backward gives the input gates'
    gradient only."""

    @staticmethod
    def forward(ctx: Any, mode: str, gates: Tensor, w_hh: Tensor, b_hh: Tensor) \
            -> tuple[Tensor, Tensor, Tensor, Tensor]:
        count, batch, steps, _ = gates.shape
        hidden = w_hh.shape[2]
        w_t = w_hh.transpose(1, 2)
        h = gates.new_zeros(count, batch, hidden)
        c = torch.zeros_like(h) if mode == "LSTM" else gates.new_zeros(0)
        outputs = gates.new_empty(count, batch, steps, hidden)
        saved = gates.new_empty(count, batch, steps, 4 * hidden) if mode in ("LSTM", "GRU") else None
        cells = gates.new_empty(count, batch, steps, hidden) if mode == "LSTM" else None
        for t in range(steps):  # LSTM and RNN steps write into the saved buffers' slices: no copies
            if mode == "LSTM":
                pre = torch.baddbmm(gates[:, :, t], h, w_t)
                act = torch.sigmoid(pre, out=saved[:, :, t])
                torch.tanh(pre[..., 2 * hidden : 3 * hidden], out=act[..., 2 * hidden : 3 * hidden])
                i, f, g, o = act.chunk(4, dim=2)
                c = torch.addcmul(f * c, i, g, out=cells[:, :, t])
                h = torch.mul(o, torch.tanh(c), out=outputs[:, :, t])
            elif mode == "GRU":
                part = torch.baddbmm(b_hh.unsqueeze(1), h, w_t)
                x_r, x_z, x_n = gates[:, :, t].chunk(3, dim=2)
                h_r, h_z, h_n = part.chunk(3, dim=2)
                reset, update = torch.sigmoid(x_r + h_r), torch.sigmoid(x_z + h_z)
                new = torch.tanh(x_n + reset * h_n)
                h = new + update * (h - new)
                saved[:, :, t] = torch.cat([reset, update, new, h_n], dim=2)
                outputs[:, :, t] = h
            else:
                pre = torch.baddbmm(gates[:, :, t], h, w_t)
                h = torch.tanh(pre, out=outputs[:, :, t]) if mode == "RNN_TANH" else \
                    torch.clamp_min(pre, 0, out=outputs[:, :, t])
        ctx.mode = mode
        ctx.save_for_backward(w_hh, outputs, saved, cells)
        resets = saved[..., :hidden].clone() if mode == "GRU" else gates.new_zeros(0)
        ctx.mark_non_differentiable(resets)
        return outputs, h.clone(), c.clone(), resets  # h and c may be views of the buffers

    @staticmethod
    def backward(ctx: Any, d_out: Tensor, d_h: Tensor, d_c: Tensor, _: Tensor) -> tuple[None, Tensor, None, None]:
        w_hh, outputs, saved, cells = ctx.saved_tensors
        mode, steps = ctx.mode, outputs.shape[2]
        if mode == "LSTM":
            i, f, g, o = saved.chunk(4, dim=3)
            tanh_c = torch.tanh(cells)
            slopes = torch.cat([g * i * (1 - i), _shifted(cells) * f * (1 - f), i * (1 - g * g),
                                tanh_c * o * (1 - o)], dim=3)
            cell_slope = o * (1 - tanh_c * tanh_c)
        elif mode == "GRU":
            reset, update, new, h_n = saved.chunk(4, dim=3)
            keep = (1 - update) * (1 - new * new)
            slopes = torch.cat([keep * h_n * reset * (1 - reset), (_shifted(outputs) - new) * update * (1 - update),
                                keep], dim=3)
            hidden_slopes = torch.cat([slopes[..., : 2 * keep.shape[-1]], keep * reset], dim=3)
        else:
            slopes = 1 - outputs * outputs if mode == "RNN_TANH" else (outputs > 0).to(outputs.dtype)
        grads = torch.empty_like(slopes)
        d_c = d_c.clone() if mode == "LSTM" else None
        for t in reversed(range(steps)):
            d_ht = d_h + d_out[:, :, t]
            if mode == "LSTM":
                d_c = torch.addcmul(d_c, d_ht, cell_slope[:, :, t])
                step_grads = torch.mul(torch.cat([d_c, d_c, d_c, d_ht], dim=2), slopes[:, :, t], out=grads[:, :, t])
                d_c = d_c * f[:, :, t]
                d_h = torch.bmm(step_grads, w_hh)
            elif mode == "GRU":
                spread = d_ht.repeat(1, 1, 3)
                grads[:, :, t] = spread * slopes[:, :, t]
                d_h = torch.baddbmm(d_ht * update[:, :, t], spread * hidden_slopes[:, :, t], w_hh)
            else:
                grads[:, :, t] = d_ht * slopes[:, :, t]
                d_h = torch.bmm(grads[:, :, t], w_hh)
        return None, grads, None, None


def gate_forward(module: nn.RNNBase, keep: dict, *args: Any, **kwargs: Any) -> Any:
    """module(*args, **kwargs) as the module computes it; eligible calls leave (input gates per layer, GateRecord)
    in keep[module] for the hook engine, others run the module's own forward."""
    if not eligible(module, args, kwargs):
        return type(module).forward(module, *args, **kwargs)
    x = args[0] if args else kwargs["input"]
    x = x if module.batch_first else x.transpose(0, 1)
    count, mode = directions(module), module.mode
    gates_per_layer, inputs, previous, resets, h_n, c_n = [], [], [], [], [], []
    for layer in range(module.num_layers):
        weights = layer_weights(module, layer)
        layer_inputs = directional_inputs(x, count)
        gates = input_gates(mode, layer_inputs, weights)
        outputs, h, c, reset = Recurrence.apply(mode, gates, weights.w_hh.detach(), weights.b_hh.detach())
        gates_per_layer.append(gates)
        inputs.append(layer_inputs.detach())
        previous.append(_shifted(outputs.detach()))
        resets.append(reset if mode == "GRU" else None)
        h_n.append(h)
        c_n.append(c)
        x = joined_outputs(outputs)
    keep[module] = (gates_per_layer, GateRecord(x.shape[0], inputs, previous, resets))
    output = x if module.batch_first else x.transpose(0, 1)
    if mode == "LSTM":
        return output, (torch.cat(h_n), torch.cat(c_n))
    return output, torch.cat(h_n)

