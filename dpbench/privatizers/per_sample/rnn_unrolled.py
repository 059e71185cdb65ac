"""nn.RNN, nn.GRU and nn.LSTM written out in plain tensor ops, all directions of a layer at once.

The fused kernels (oneDNN, cuDNN) hide their gate activations and have no batching rule: vmap loops over them per
sample, and the native kernel writes in place into an unbatched state, which vmap refuses. Written out, the same
recurrence serves the hook rules (rnn_recompute.py back-propagates recorded output gradients to the gate
pre-activations) and the functorch engine (which runs `recurrent_forward` under vmap instead of the kernel).
PyTorch's gate layouts:
    RNN:  h' = act(W_ih x + b_ih + W_hh h + b_hh)
    GRU:  r, z = sigmoid(W_i. x + b_i. + W_h. h + b_h.),  n = tanh(W_in x + b_in + r * (W_hn h + b_hn)),
          h' = (1 - z) n + z h
    LSTM: i, f, g, o = act(W_ih x + b_ih + W_hh h + b_hh),  c' = f c + i g,  h' = o tanh(c')  (W_hr h' if projected)
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from dpbench.core.errors import UnsupportedModelError

RECURRENT_LAYERS = (nn.RNN, nn.GRU, nn.LSTM)


class LayerWeights(NamedTuple):
    """One layer's parameters stacked over its directions D; zero biases when the module has none."""

    w_ih: Tensor  # (D, G*H, in)
    w_hh: Tensor  # (D, G*H, H_out)
    b_ih: Tensor  # (D, G*H)
    b_hh: Tensor  # (D, G*H)
    w_hr: Tensor | None  # (D, P, H): LSTM projections


class LayerRun(NamedTuple):
    """One layer's recurrence, each direction in its own processing order (reverse: time flipped)."""

    outputs: Tensor  # (D, B, T, H_out)
    previous: Tensor  # (D, B, T, H_out): the state each step started from
    resets: Tensor | None  # (D, B, T, H): GRU's reset gates r_t
    h: Tensor  # (D, B, H_out): final states
    c: Tensor | None  # (D, B, H): LSTM's final cells


def directions(module: nn.RNNBase) -> int:
    return 2 if module.bidirectional else 1


def parameter_suffixes(module: nn.RNNBase, layer: int) -> list[str]:
    return [f"_l{layer}" + ("_reverse" if d else "") for d in range(directions(module))]


def layer_weights(module: nn.RNNBase, layer: int) -> LayerWeights:
    suffixes = parameter_suffixes(module, layer)

    def stacked(name: str) -> Tensor:
        return torch.stack([getattr(module, name + suffix) for suffix in suffixes])

    w_ih, w_hh = stacked("weight_ih"), stacked("weight_hh")
    if module.bias:
        b_ih, b_hh = stacked("bias_ih"), stacked("bias_hh")
    else:
        b_ih = b_hh = w_hh.new_zeros(w_hh.shape[:2])
    return LayerWeights(w_ih, w_hh, b_ih, b_hh, stacked("weight_hr") if module.proj_size else None)


def directional_inputs(x: Tensor, count: int) -> Tensor:
    """(D, B, T, in): a batch-first sequence in each direction's processing order."""
    return torch.stack([x, x.flip(1)] if count == 2 else [x])


def joined_outputs(outputs: Tensor) -> Tensor:
    """(B, T, D*H_out) in time order, directions side by side, as the kernels return them."""
    return torch.cat([outputs[0], *[o.flip(1) for o in outputs[1:]]], dim=2)


def input_gates(mode: str, inputs: Tensor, weights: LayerWeights) -> Tensor:
    """(D, B, T, G*H): W_ih x plus the biases that act as a sum (both, except GRU's b_hh: r gates b_hn)."""
    bias = weights.b_ih if mode == "GRU" else weights.b_ih + weights.b_hh
    count, batch, steps, features = inputs.shape
    flat = torch.baddbmm(bias[:, None], inputs.reshape(count, batch * steps, features), weights.w_ih.transpose(1, 2))
    return flat.view(count, batch, steps, -1)  # one matmul per direction: 2x faster than broadcasting over the batch


def run_layer(mode: str, gates: Tensor, weights: LayerWeights, h: Tensor, c: Tensor | None) -> LayerRun:
    """The recurrence from input gates (D, B, T, G*H) and initial states h (D, B, H_out), c (LSTM, D, B, H)."""
    w_hh_t = weights.w_hh.transpose(1, 2)
    w_hr_t = None if weights.w_hr is None else weights.w_hr.transpose(1, 2)
    outputs, previous, resets = [], [], []
    for step in gates.unbind(2):
        previous.append(h)
        hidden = torch.bmm(h, w_hh_t)
        if mode == "LSTM":
            i, f, g, o = (step + hidden).chunk(4, dim=2)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            h = h if w_hr_t is None else torch.bmm(h, w_hr_t)
        elif mode == "GRU":
            x_r, x_z, x_n = step.chunk(3, dim=2)
            h_r, h_z, h_n = (hidden + weights.b_hh.unsqueeze(1)).chunk(3, dim=2)
            reset, update = torch.sigmoid(x_r + h_r), torch.sigmoid(x_z + h_z)
            new = torch.tanh(x_n + reset * h_n)
            h = new + update * (h - new)
            resets.append(reset)
        else:
            h = (torch.tanh if mode == "RNN_TANH" else torch.relu)(step + hidden)
        outputs.append(h)
    return LayerRun(torch.stack(outputs, 2), torch.stack(previous, 2), torch.stack(resets, 2) if resets else None, h, c)


def _initial_states(module: nn.RNNBase, hx, batch: int, like: Tensor) -> tuple[Tensor, Tensor | None]:
    """(L*D, B, H_out) states and, for the LSTM, (L*D, B, H) cells: hx as given (batched), else zeros."""
    if hx is not None:
        return (hx[0], hx[1]) if isinstance(module, nn.LSTM) else (hx, None)
    count = module.num_layers * directions(module)
    h = like.new_zeros(count, batch, module.proj_size or module.hidden_size)
    return h, like.new_zeros(count, batch, module.hidden_size) if isinstance(module, nn.LSTM) else None


def recurrent_forward(module: nn.RNNBase, sequence: Tensor, hx=None, *, name: str) -> tuple:
    """What module(sequence, hx) returns, computed by `run_layer` (inter-layer dropout included while training)."""
    if isinstance(sequence, PackedSequence):
        raise UnsupportedModelError(
            f"{name} ({type(module).__name__}) was given a PackedSequence: per-sample gradients need padded tensors"
        )
    unbatched = sequence.dim() == 2
    if unbatched:
        x = sequence.unsqueeze(0)
        if hx is not None:
            hx = tuple(s.unsqueeze(1) for s in hx) if isinstance(module, nn.LSTM) else hx.unsqueeze(1)
    else:
        x = sequence if module.batch_first else sequence.transpose(0, 1)
    h0, c0 = _initial_states(module, hx, x.shape[0], x)
    count = directions(module)
    finals = []
    for layer in range(module.num_layers):
        if layer and module.training and module.dropout > 0:
            x = F.dropout(x, module.dropout, training=True)
        weights = layer_weights(module, layer)
        states = slice(layer * count, (layer + 1) * count)
        run = run_layer(module.mode, input_gates(module.mode, directional_inputs(x, count), weights), weights,
                        h0[states], None if c0 is None else c0[states])
        finals.append(run)
        x = joined_outputs(run.outputs)
    h_n = torch.cat([run.h for run in finals])
    c_n = torch.cat([run.c for run in finals]) if isinstance(module, nn.LSTM) else None
    if unbatched:
        x, h_n, c_n = x.squeeze(0), h_n.squeeze(1), None if c_n is None else c_n.squeeze(1)
    elif not module.batch_first:
        x = x.transpose(0, 1)
    return x, (h_n, c_n) if c_n is not None else h_n
