"""JL's graph-free passes run linear layers, LayerNorm and GELU by their own forward-mode rules (forward_mode/linear.py,
forward_mode/pointwise.py): in float64 the projections are <grad loss_i, v_j> of a per-example loop, and equal those of
functorch's rules, for every arrangement of trainable and frozen parameters, in vmapped chunks and in the
one-direction dual pass."""

import contextlib

import pytest
import torch
from torch import nn

from dpbench.privatizers import jl as jl_module
from dpbench.privatizers.per_sample.forward_mode import linear as linear_rule
from dpbench.privatizers.per_sample.forward_mode import pointwise as pointwise_rule
from dpbench.privatizers.per_sample.forward_mode.rules import tangent_rules
from tests.helpers.jl_projections import projections, projections_and_reference
from tests.helpers.tangent_models import FEATURES, TOKENS, Block, SharedLayer

pytestmark = pytest.mark.models_as_built

CASES = {
    "all trainable": dict(),
    "linear layers without bias": dict(bias=False),
    "LayerNorm without affine parameters": dict(affine=False),
    "LayerNorm without bias": dict(norm_bias=False),
    "LayerNorm over tokens and features": dict(norm_over_tokens=True),
    "GELU tanh approximation": dict(approximate="tanh"),
    "frozen weight, trainable bias": dict(frozen=("up.weight",)),
    "frozen linear layer": dict(frozen=("up.weight", "up.bias")),
    "frozen data-reading layer": dict(frozen=("embed.weight", "embed.bias")),
    "data-reading layer: frozen weight, trainable bias": dict(frozen=("embed.weight",)),
    "frozen LayerNorm weight": dict(frozen=("norm.weight",)),
    "frozen LayerNorm": dict(frozen=("norm.weight", "norm.bias")),
    "LayerNorm's bias the only tangent": dict(frozen=("embed.weight", "embed.bias", "norm.weight")),
}


@contextlib.contextmanager
def functorch_rules(model):
    yield


def _batch(tokens: bool = True):
    torch.manual_seed(0)
    shape = (6, TOKENS, FEATURES) if tokens else (6, FEATURES)
    return torch.randn(*shape, dtype=torch.float64), torch.randint(0, 3, (6,))


@pytest.mark.parametrize("chunk_size", [1, 4], ids=["dual pass", "vmap chunk"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_projections_are_the_per_example_gradients_along_the_directions(name, chunk_size, monkeypatch):
    batch = _batch()
    model = Block(**CASES[name]).double()
    with torch.no_grad():  # LayerNorm's affine parameters away from their initial ones and zeros
        for module in (model.norm,):
            for p in module.parameters():
                p.add_(torch.randn_like(p) * 0.3)
    projected, reference = projections_and_reference(model, batch, chunk_size)
    assert projected.shape == reference.shape == (6, 4)
    torch.testing.assert_close(projected, reference, rtol=1e-10, atol=1e-12)
    with monkeypatch.context() as patch:
        patch.setattr(jl_module, "tangent_rules", functorch_rules)
        torch.testing.assert_close(projected, projections(model, batch, chunk_size), rtol=1e-12, atol=1e-13)


def test_inputs_without_a_token_dimension():
    """Without tokens the block skips its attention, whose frozen parameters then get no gradient."""
    batch = _batch(tokens=False)
    model = Block(frozen=tuple(f"{layer}.{p}" for layer in ("query", "key", "value") for p in ("weight", "bias")))
    model = model.double()
    projected, reference = projections_and_reference(model, batch, 4)
    torch.testing.assert_close(projected, reference, rtol=1e-10, atol=1e-12)


def test_the_vmapped_chunk_takes_each_rule_once_per_layer(monkeypatch):
    """The rules' own vmap paths run (not functorch's fallback): once per linear layer, LayerNorm and GELU call."""
    calls = []
    for owner, name in [(linear_rule._LinearTangents, "vmap"), (pointwise_rule._LayerNormTangents, "vmap"),
                        (pointwise_rule._GeluTangents, "vmap")]:
        original = getattr(owner, name)

        def counting(*args, original=original, owner=owner):
            calls.append(owner.__name__)
            return original(*args)

        monkeypatch.setattr(owner, name, staticmethod(counting))
    projections(Block(), (torch.randn(6, TOKENS, FEATURES), torch.randint(0, 3, (6,))), chunk_size=4)
    assert sorted(calls) == ["_GeluTangents", "_LayerNormTangents"] + ["_LinearTangents"] * 7


@pytest.mark.parametrize("chunk_size", [1, 4], ids=["dual pass", "vmap chunk"])
@pytest.mark.parametrize("rows", [1, 3])
def test_a_bias_only_tangent_over_one_row_stays_its_own(rows, chunk_size, monkeypatch):
    """Over a single row a bias tangent expanded to the output is the direction's own storage unless copied; the
    rule must never hand it on (a Poisson batch of one, the NaN retry's smaller batch)."""
    torch.manual_seed(1)
    model = SharedLayer().double()
    model.shared.weight.requires_grad_(False)
    batch = (torch.randn(rows, 4, dtype=torch.float64), torch.randint(0, 3, (rows,)))
    projected, reference = projections_and_reference(model, batch, chunk_size)
    torch.testing.assert_close(projected, reference, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("layer", ["linear", "layer_norm", "gelu"])
def test_the_rules_batch_over_a_batched_primal(layer):
    """Outside JL's shape (the primal itself batched) each rule gives functorch's tangents."""
    torch.manual_seed(2)
    module = {"linear": nn.Linear(5, 3), "layer_norm": nn.LayerNorm(5), "gelu": nn.GELU()}[layer].double()
    xs, tangents = torch.randn(4, 2, 5, dtype=torch.float64), torch.randn(4, 2, 5, dtype=torch.float64)

    def tangent(x, dx):
        return torch.func.jvp(module, (x,), (dx,))[1]

    with torch.no_grad():
        expected = torch.vmap(tangent)(xs, tangents)
        with tangent_rules(module):
            got = torch.vmap(tangent)(xs, tangents)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-13)
