"""JL's graph-free passes run convolutions by their own forward-mode rule (forward_mode/conv.py): in float64 the
projections are <grad loss_i, v_j> of a per-example loop, and equal those of functorch's rule for every kind of
convolution, in vmapped chunks and in the one-direction dual pass."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dpbench.privatizers.per_sample.forward_mode import rules
from tests.helpers.jl_projections import projections, projections_and_reference
from tests.helpers.tangent_models import ConvNet

pytestmark = pytest.mark.models_as_built


CASES = {
    "2d": (dict(dims=2), (7, 7)),
    "2d no bias": (dict(dims=2, bias=False), (6, 6)),
    "2d reflect padding": (dict(dims=2, padding_mode="reflect"), (6, 5)),
    "2d groups 2": (dict(dims=2, groups=2), (6, 6)),
    "2d frozen weight, trainable bias": (dict(dims=2, frozen_weight=True), (6, 6)),
    "2d frozen second convolution": (dict(dims=2, frozen=True), (6, 6)),
    "2d dilation 2, padding same": (dict(dims=2, dilation=2), (9, 9)),
    "1d": (dict(dims=1), (9,)),
    "3d": (dict(dims=3), (4, 4, 4)),
}


@pytest.mark.parametrize("chunk_size", [1, 4], ids=["dual pass", "vmap chunk"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_projections_are_the_per_example_gradients_along_the_directions(name, chunk_size, monkeypatch):
    options, size = CASES[name]
    torch.manual_seed(0)
    model = ConvNet(**options).double()
    x = torch.randn(5, 2, *size, dtype=torch.float64)
    batch = (x, torch.randint(0, 3, (5,)))
    model(x)  # materialise the lazy head
    projected, reference = projections_and_reference(model, batch, chunk_size)
    assert projected.shape == reference.shape == (5, 4)
    torch.testing.assert_close(projected, reference, rtol=1e-10, atol=1e-12)
    with monkeypatch.context() as patch:
        for convolution in (nn.Conv1d, nn.Conv2d, nn.Conv3d):
            patch.delitem(rules.MODULE_RULES, convolution)
        torch.testing.assert_close(projected, projections(model, batch, chunk_size), rtol=1e-12, atol=1e-13)


def test_the_first_layers_weight_tangents_run_as_one_convolution(monkeypatch):
    """r directions of the data-reading layer: one convolution with r times its output channels, its bias inside."""
    torch.manual_seed(0)
    model = ConvNet(dims=2)
    x = torch.randn(5, 2, 7, 7)
    model(x)
    calls = []
    original = F.conv2d

    def counting(inputs, weight, bias=None, *args):
        calls.append((tuple(inputs.shape), tuple(weight.shape), None if bias is None else tuple(bias.shape)))
        return original(inputs, weight, bias, *args)

    monkeypatch.setattr(F, "conv2d", counting)
    projections(model, (x, torch.randint(0, 3, (5,))), chunk_size=4)
    assert ((5, 2, 7, 7), (16, 2, 3, 3), (16,)) in calls


class SampleLoop(nn.Module):
    """A convolution called on one unbatched sample at a time ((C, L) or (C, H, W), as a loop over variable-length
    samples calls it), channels equal to length so that reading channels as the batch would not fail on shapes."""

    def __init__(self, conv: nn.Module, features: int):
        super().__init__()
        self.conv, self.head = conv, nn.Linear(features, 3)

    def forward(self, x):
        return self.head(torch.stack([self.conv(sample).flatten() for sample in x]))


@pytest.mark.parametrize("chunk_size", [1, 4], ids=["dual pass", "vmap chunk"])
@pytest.mark.parametrize("conv, shape", [(nn.Conv1d(8, 8, 3, padding=1), (8, 8)),
                                         (nn.Conv2d(3, 5, 3, padding=1), (3, 3, 7))], ids=["1d", "2d"])
def test_a_convolution_on_unbatched_samples_projects_exactly(conv, shape, chunk_size):
    torch.manual_seed(0)
    conv = conv.double()
    features = conv(torch.zeros(*shape, dtype=torch.float64)).numel()
    model = SampleLoop(conv, features).double()
    batch = (torch.randn(6, *shape, dtype=torch.float64), torch.randint(0, 3, (6,)))
    projected, reference = projections_and_reference(model, batch, chunk_size)
    torch.testing.assert_close(projected, reference, rtol=1e-10, atol=1e-12)
