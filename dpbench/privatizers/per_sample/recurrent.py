"""Exact per-sample gradients of nn.LSTM for the hook engine, without vmap (which loops per sample over oneDNN).

The fast LSTM kernel hides its gate activations, so the rule re-runs the recurrence from the recorded input
(all directions of a layer at once, one batched matmul per time step) and back-propagates the recorded output
gradients to the gate pre-activations dG_t. Every LSTM weight is then an outer-product site:
    weight_ih: sum_t dG_t x_t^T,  weight_hh: sum_t dG_t h_{t-1}^T,  bias_ih = bias_hh: sum_t dG_t.
Assumes what the recompute can reproduce: zero initial state, no inter-layer dropout while training, no
projections, padded tensors (not PackedSequence); anything else is refused.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dpbench.errors import UnsupportedModelError
from dpbench.privatizers.per_sample.layers import LAYER_HANDLERS, SiteMap, outer_product_site
from dpbench.privatizers.per_sample.sites import DenseSite


def refuse_unsupported_call(module: nn.Module, args: tuple, kwargs: dict) -> None:
    """Called by the hook engine on every recorded forward: the rule recomputes from the input alone."""
    if not isinstance(module, nn.LSTM):
        return
    if not isinstance(args[0], Tensor):
        raise UnsupportedModelError("per-sample nn.LSTM gradients need padded tensors, not a PackedSequence")
    initial_state = args[1] if len(args) > 1 else kwargs.get("hx")
    if initial_state is not None:
        raise UnsupportedModelError("per-sample nn.LSTM gradients assume a zero initial state: do not pass hx")


def check_recomputable(module: nn.LSTM) -> None:
    """The rules here rebuild the recurrence from weights and input alone: no projections, no inter-layer dropout."""
    if module.proj_size:
        raise UnsupportedModelError("per-sample gradients of nn.LSTM with proj_size > 0 are unsupported")
    if module.training and module.dropout > 0 and module.num_layers > 1:
        raise UnsupportedModelError("nn.LSTM with inter-layer dropout: set dropout=0 for exact per-sample gradients")


def stacked_layer_weights(module: nn.LSTM, layer: int) -> tuple[Tensor, Tensor, Tensor]:
    """(w_ih, w_hh, b_ih + b_hh) of a layer, stacked over its directions (zero bias when the LSTM has none)."""
    suffixes = [f"_l{layer}" + ("_reverse" if d else "") for d in range(2 if module.bidirectional else 1)]
    w_ih = torch.stack([getattr(module, "weight_ih" + s) for s in suffixes])
    w_hh = torch.stack([getattr(module, "weight_hh" + s) for s in suffixes])
    if module.bias:
        bias = torch.stack([getattr(module, "bias_ih" + s) + getattr(module, "bias_hh" + s) for s in suffixes])
    else:
        bias = w_hh.new_zeros(w_hh.shape[:2])
    return w_ih, w_hh, bias


def _recur(gate_inputs: Tensor, w_hh: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """gate_inputs (D, B, T, 4H) in each direction's processing order; returns outputs and previous states
    (D, B, T, H) in that order, and the final h, c (D, B, H)."""
    directions, batch, _, width = gate_inputs.shape
    h = gate_inputs.new_zeros(directions, batch, width // 4)
    c = torch.zeros_like(h)
    w_hh_t = w_hh.transpose(1, 2)
    outputs, previous = [], []
    for step in gate_inputs.unbind(2):
        previous.append(h)
        i, f, g, o = (step + torch.bmm(h, w_hh_t)).chunk(4, dim=2)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        outputs.append(h)
    return torch.stack(outputs, 2), torch.stack(previous, 2), h, c


def lstm_sites(module: nn.LSTM, x: Tensor, g: tuple, dense: bool) -> SiteMap:
    """g is the gradient of the LSTM's whole output: (output, (h_n, c_n))."""
    check_recomputable(module)
    out_grad, (h_grad, c_grad) = g
    if not module.batch_first:
        x, out_grad = x.transpose(0, 1), out_grad.transpose(0, 1)
    directions = 2 if module.bidirectional else 1
    layers = []  # per layer: parameter names, inputs and previous states in processing order, gate inputs
    with torch.enable_grad():
        layer_input = x
        finals_h, finals_c = [], []
        for layer in range(module.num_layers):
            suffixes = [f"_l{layer}" + ("_reverse" if d else "") for d in range(directions)]
            w_ih, w_hh, bias = (weight.detach() for weight in stacked_layer_weights(module, layer))
            inputs = torch.stack([layer_input, layer_input.flip(1)][:directions])  # (D, B, T, in)
            gate_inputs = inputs @ w_ih.transpose(1, 2).unsqueeze(1) + bias[:, None, None]
            if not gate_inputs.requires_grad:  # the first layer: a leaf
                gate_inputs.requires_grad_()
            outputs, previous, h, c = _recur(gate_inputs, w_hh)
            layers.append((suffixes, inputs.detach(), previous.detach(), gate_inputs))
            finals_h.append(h)
            finals_c.append(c)
            layer_input = torch.cat([outputs[0], *[o.flip(1) for o in outputs[1:]]], dim=2)
        gate_grads = torch.autograd.grad(
            [layer_input, torch.cat(finals_h), torch.cat(finals_c)],
            [gate_inputs for *_, gate_inputs in layers],
            [out_grad, h_grad, c_grad],
        )
    sites: SiteMap = {}
    for (suffixes, inputs, previous, _), grads in zip(layers, gate_grads, strict=True):
        for d, suffix in enumerate(suffixes):
            for name, factor in (("weight_ih", inputs[d]), ("weight_hh", previous[d])):
                param = getattr(module, name + suffix)
                if param.requires_grad:
                    sites[param] = outer_product_site(factor, grads[d], param.shape, dense)
            for name in ("bias_ih", "bias_hh") if module.bias else ():
                param = getattr(module, name + suffix)
                if param.requires_grad:
                    sites[param] = DenseSite(grads[d].sum(1))
    return sites


LAYER_HANDLERS[nn.LSTM] = lstm_sites
