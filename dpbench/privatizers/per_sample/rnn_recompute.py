"""Exact per-sample gradients of nn.RNN, nn.GRU and nn.LSTM for the hook engine, without vmap (which loops per sample
over the fused kernels).

The fused kernels hide their gate activations, so the rule re-runs the recurrence from the recorded input
(rnn_unrolled.py: all directions of a layer at once, one batched matmul per time step) and back-propagates the recorded
output gradients to the input gates dG_t = d(W_ih x_t + b). Every weight is then an outer-product site:
    weight_ih: sum_t dG_t x_t^T,  bias_ih: sum_t dG_t,  weight_hh: sum_t dH_t h_{t-1}^T,  bias_hh: sum_t dH_t,
where dH_t = dG_t for RNN and LSTM (their biases act as one sum) and, for GRU, dG_t on the r and z gates but
r_t * dG_t on the new gate, since n = tanh(W_in x + b_in + r * (W_hn h + b_hn)).
Assumes what the recompute can reproduce: zero initial state, no inter-layer dropout while training, no
projections, batched padded tensors (not PackedSequence); anything else is refused.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dpbench.core.errors import UnsupportedModelError
from dpbench.privatizers.per_sample.layers import LAYER_HANDLERS, SiteMap, outer_product_site
from dpbench.privatizers.per_sample.rnn_gate_forward import GateRecord
from dpbench.privatizers.per_sample.rnn_unrolled import (
    RECURRENT_LAYERS,
    LayerWeights,
    directional_inputs,
    directions,
    input_gates,
    joined_outputs,
    layer_weights,
    parameter_suffixes,
    run_layer,
)
from dpbench.privatizers.per_sample.sites import DenseSite


def refuse_unsupported_call(module: nn.Module, args: tuple, kwargs: dict) -> None:
    """Called by the hook engine on every recorded forward: the rules recompute from the input alone."""
    if not isinstance(module, RECURRENT_LAYERS):
        return
    kind = type(module).__name__
    if not isinstance(args[0], Tensor):
        raise UnsupportedModelError(f"per-sample {kind} gradients need padded tensors, not a PackedSequence")
    if args[0].dim() != 3:
        raise UnsupportedModelError(f"per-sample {kind} gradients need a batched (3-D) input, got {args[0].dim()}-D")
    initial_state = args[1] if len(args) > 1 else kwargs.get("hx")
    if initial_state is not None:
        raise UnsupportedModelError(
            f"per-sample {kind} gradients from hooks assume a zero initial state: do not pass hx "
            "(privatizer.engine=functorch takes one)"
        )


def check_recomputable(module: nn.RNNBase) -> None:
    """The rules rebuild the recurrence from weights and input alone: no projections, no inter-layer dropout."""
    kind = type(module).__name__
    if module.proj_size:
        raise UnsupportedModelError(f"per-sample gradients of {kind} with proj_size > 0 from hooks are unsupported")
    if module.training and module.dropout > 0 and module.num_layers > 1:
        raise UnsupportedModelError(f"{kind} with inter-layer dropout: set dropout=0 for exact per-sample gradients")


def stacked_layer_weights(module: nn.LSTM, layer: int) -> tuple[Tensor, Tensor, Tensor]:
    """(w_ih, w_hh, b_ih + b_hh) of an LSTM layer, stacked over its directions: its two biases act as one."""
    weights = layer_weights(module, layer)
    return weights.w_ih, weights.w_hh, weights.b_ih + weights.b_hh


def _hidden_gate_grads(mode: str, gate_grads: Tensor, resets: Tensor | None) -> Tensor:
    """dH from dG: equal, but for GRU's new gate, whose hidden part W_hn h + b_hn is scaled by the reset gate."""
    if mode != "GRU":
        return gate_grads
    hidden = resets.shape[-1]
    return torch.cat([gate_grads[..., : 2 * hidden], gate_grads[..., 2 * hidden :] * resets], dim=-1)


def recurrent_sites(module: nn.RNNBase, x: Tensor | GateRecord, g, dense: bool) -> SiteMap:
    """g is the gradient of the layer's whole output: (output, h_n), or (output, (h_n, c_n)) for the LSTM; or, after
    rnn_gate_forward's forward (x a GateRecord), the gradients of each layer's input gates."""
    if isinstance(x, GateRecord):
        layers = zip(range(module.num_layers), x.inputs, x.previous, x.resets, strict=True)
        return _gate_sites(module, layers, g, dense)
    check_recomputable(module)
    out_grad, state_grad = g
    state_grads = list(state_grad) if isinstance(module, nn.LSTM) else [state_grad]
    if not module.batch_first:
        x, out_grad = x.transpose(0, 1), out_grad.transpose(0, 1)
    mode, count = module.mode, directions(module)
    layers = []  # per layer: its number, inputs and previous states in processing order, resets, input gates
    with torch.enable_grad():
        layer_input, runs = x, []
        for layer in range(module.num_layers):
            weights = LayerWeights(*(None if w is None else w.detach() for w in layer_weights(module, layer)))
            inputs = directional_inputs(layer_input, count)
            gates = input_gates(mode, inputs, weights)
            if not gates.requires_grad:  # the first layer: a leaf
                gates.requires_grad_()
            zeros = gates.new_zeros(count, x.shape[0], module.hidden_size)
            run = run_layer(mode, gates, weights, zeros, zeros if mode == "LSTM" else None)
            resets = None if run.resets is None else run.resets.detach()
            layers.append((layer, inputs.detach(), run.previous.detach(), resets, gates))
            runs.append(run)
            layer_input = joined_outputs(run.outputs)
        finals = [torch.cat([run.h for run in runs])]
        if mode == "LSTM":
            finals.append(torch.cat([run.c for run in runs]))
        gate_grads = torch.autograd.grad([layer_input, *finals], [gates for *_, gates in layers],
                                         [out_grad, *state_grads])
    return _gate_sites(module, [layer[:4] for layer in layers], gate_grads, dense)


def _gate_sites(module: nn.RNNBase, layers, gate_grads, dense: bool) -> SiteMap:
    """Every weight's sites from each layer's (number, inputs, previous states, resets) and input-gate gradients."""
    mode = module.mode
    sites: SiteMap = {}
    for (layer, inputs, previous, resets), grads in zip(layers, gate_grads, strict=True):
        hidden_grads = _hidden_gate_grads(mode, grads, resets)
        for d, suffix in enumerate(parameter_suffixes(module, layer)):
            terms = [("weight_ih", inputs[d], grads[d]), ("weight_hh", previous[d], hidden_grads[d])]
            if module.bias:  # a bias is a weight whose input is 1 at every step
                terms += [("bias_ih", None, grads[d]), ("bias_hh", None, hidden_grads[d])]
            for name, factor, grad in terms:
                param = getattr(module, name + suffix)
                if not param.requires_grad:
                    continue
                if factor is None:
                    sites[param] = DenseSite(grad.sum(1))
                else:
                    sites[param] = outer_product_site(factor, grad, param.shape, dense)
    return sites


LAYER_HANDLERS.update(dict.fromkeys(RECURRENT_LAYERS, recurrent_sites))
