"""The arithmetic of one benchmark step, in floating-point operations of its products (torch's FlopCounterMode).

A ratio of step times is judged against the ratio of the work the steps must do: a private step that needs eight times
a non-private step's products cannot run in five times its time by any scheduling of the same kernels. The counter
covers matrix products, convolutions and the GPU's fused attention; the CPU's fused attention and oneDNN's fused
recurrent layers, which the non-private steps run on this machine, and the in-place product that JL's linear rule
runs are registered here: the attention with torch's own formulas for the GPU's kernels (two products forward, five
backward, which recomputes the scores), an LSTM layer with the products it replaces (2 B T 4H (E + H) forward, twice
that backward), the in-place product as the product. The library's count of a grouped
convolution's weight gradient ignores the groups (torch 2.13: 256 times too many for the per-sample rule that folds a
batch of 256 into the groups), so that formula is replaced. Elementwise work is not counted.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch.utils.flop_counter import (
    FlopCounterMode,
    conv_flop_count,
    flop_registry,
    register_flop_formula,
    sdpa_backward_flop_count,
    sdpa_flop_count,
    shape_wrapper,
)

aten = torch.ops.aten


def _where_missing(target):
    """Register a formula only where torch has none (a later torch that counts these ops keeps its own)."""
    return register_flop_formula(target) if target not in flop_registry else (lambda formula: formula)


@_where_missing(aten._scaled_dot_product_flash_attention_for_cpu)
def _cpu_attention(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


@_where_missing(aten._scaled_dot_product_flash_attention_for_cpu_backward)
def _cpu_attention_backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None,
                            **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def recurrent_layer_flops(input_shape: tuple[int, ...], w_ih_shape: tuple[int, ...],
                          w_hh_shape: tuple[int, ...]) -> int:
    """One direction of one layer, forward: every step multiplies its input and its previous state by the gates'
    weights (`input_shape` holds the sequence and batch dimensions first, in either order)."""
    rows = math.prod(input_shape[:2])
    return 2 * rows * (math.prod(w_ih_shape) + math.prod(w_hh_shape))


@_where_missing(aten.mkldnn_rnn_layer)
def _recurrent_layer(input_shape, w_ih_shape, w_hh_shape, *args, out_shape=None, **kwargs) -> int:
    return recurrent_layer_flops(input_shape, w_ih_shape, w_hh_shape)


@_where_missing(aten.mkldnn_rnn_layer_backward)
def _recurrent_layer_backward(input_shape, w_ih_shape, w_hh_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * recurrent_layer_flops(input_shape, w_ih_shape, w_hh_shape)  # the inputs' and the weights' gradients


@_where_missing(aten.addmm_)
def _addmm_in_place(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """JL's linear rule adds its input tangent's product into the tangent in place."""
    return 2 * a_shape[0] * a_shape[1] * b_shape[1]


def _channels_first(shape: tuple[int, ...]) -> list[int]:
    return [shape[1], shape[0], *shape[2:]]


def _convolution_backward(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                          _output_padding, groups, output_mask, out_shape=None, **kwargs) -> int:
    """The input's gradient as a transposed convolution by the weight (groups are in the weight's shape), and the
    weight's as a convolution of the input by the output's gradient within each group."""
    flops = 0
    if output_mask[0]:
        flops += conv_flop_count(grad_out_shape, w_shape, out_shape[0], not transposed)
    if output_mask[1]:
        first, second = (grad_out_shape, x_shape) if transposed else (x_shape, grad_out_shape)
        flops += conv_flop_count(_channels_first(first), _channels_first(second), _channels_first(out_shape[1]),
                                 transposed=False) // groups
    return flops


flop_registry[aten.convolution_backward] = shape_wrapper(_convolution_backward)


def step_gflop(step: Callable[[], None]) -> float:
    """Run `step` under the counter: its products' floating-point operations, in billions."""
    with FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops() / 1e9
