"""The benchmark's arithmetic counts: the fused kernels that the counter does not know are registered with the work
of the products they replace, so a non-private step running them is not counted as nearly free."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.step_flops import step_gflop


def _counted(run) -> dict[str, int]:
    with FlopCounterMode(display=False) as counter:
        run()
    return {str(op).split(".")[-1]: flops for op, flops in counter.get_flop_counts()["Global"].items()}


def test_fused_lstm_forward_counts_as_its_unfused_products():
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(8, 16, num_layers=2, batch_first=True, bidirectional=True)
    x = torch.randn(4, 5, 8)
    with torch.backends.mkldnn.flags(enabled=True):
        fused = _counted(lambda: lstm(x))
    with torch.backends.mkldnn.flags(enabled=False):
        unfused = _counted(lambda: lstm(x))
    assert set(fused) == {"mkldnn_rnn_layer"}, "the fused kernel is no longer what CPU LSTMs run: update step_flops"
    rows, layers, directions = 4 * 5, 2, 2
    by_hand = 2 * rows * 4 * 16 * ((8 + 16) + (2 * 16 + 16) * (layers - 1)) * directions
    assert fused["mkldnn_rnn_layer"] == sum(unfused.values()) == by_hand


def test_fused_lstm_backward_counts_every_gradient_product():
    lstm = torch.nn.LSTM(8, 16, batch_first=True)
    x = torch.randn(4, 5, 8, requires_grad=True)

    def step() -> None:
        lstm(x)[0].sum().backward()

    counted = _counted(step)
    forward = counted["mkldnn_rnn_layer"]
    assert forward == 2 * 20 * 64 * (8 + 16)
    assert counted["mkldnn_rnn_layer_backward"] == 2 * forward  # inputs' and weights' gradients


@pytest.mark.parametrize("backward", [False, True])
def test_cpu_fused_attention_counts_as_the_math_products(backward: bool):
    q = torch.randn(2, 4, 17, 16, requires_grad=True)

    def run(backend: SDPBackend | None) -> dict[str, int]:
        def step() -> None:
            out = torch.nn.functional.scaled_dot_product_attention(q, q, q)
            if backward:
                out.sum().backward()

        with sdpa_kernel(backend) if backend else contextlib.nullcontext():
            return _counted(step)

    fused, math_path = run(None), run(SDPBackend.MATH)
    assert "_scaled_dot_product_flash_attention_for_cpu" in fused
    products = 2 * (2 * 4) * 17 * 16 * 17  # one (17 x 16) @ (16 x 17) product per head
    assert sum(math_path.values()) == (6 if backward else 2) * products
    # the fused backward recomputes the scores: one product more than the math path's four
    assert sum(fused.values()) == (7 if backward else 2) * products


def test_step_gflop_counts_a_linear_step():
    layer = torch.nn.Linear(300, 200)
    x = torch.randn(50, 300)  # no gradient wanted for it: the forward and the weight's gradient, two products
    assert step_gflop(lambda: layer(x).sum().backward()) == pytest.approx(2 * 2 * 50 * 300 * 200 / 1e9)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("groups", [1, 4])
def test_grouped_convolution_backward_counts_each_group_once(groups: int, transposed: bool):
    """The grouped convolution's count equals that of its groups run as separate convolutions."""
    torch.manual_seed(0)
    x = torch.randn(3, 8, 10, 10, requires_grad=True)
    # (out, in / groups, k, k) for a convolution, (in, out / groups, k, k) for a transposed one
    weight = torch.randn(8, 12 // groups, 3, 3) if transposed else torch.randn(12, 8 // groups, 3, 3)
    weight.requires_grad_()
    convolution = torch.nn.functional.conv_transpose2d if transposed else torch.nn.functional.conv2d

    def grouped() -> None:
        convolution(x, weight, stride=2, groups=groups).sum().backward()

    def separate() -> None:
        outputs = [convolution(xs, ws, stride=2)
                   for xs, ws in zip(x.chunk(groups, 1), weight.chunk(groups, 0), strict=True)]
        torch.cat(outputs, 1).sum().backward()

    counted, by_group = _counted(grouped), _counted(separate)
    assert counted["convolution_backward"] == by_group["convolution_backward"]
    assert counted["convolution"] == by_group["convolution"]


def test_a_product_added_in_place_counts_as_the_product():
    """JL's linear rule adds its input tangent's product into the tangent in place (total.addmm_)."""
    total, a, b = torch.zeros(6, 5), torch.randn(6, 4), torch.randn(4, 5)
    assert _counted(lambda: total.addmm_(a, b)) == {"addmm_": 2 * 6 * 4 * 5}
    assert _counted(lambda: torch.addmm(total, a, b)) == {"addmm": 2 * 6 * 4 * 5}
