"""JL's graph-free passes take max-pooling from the graph pass's argmax (forward_mode/pool.py): the projections equal
those of pooling again, in float64, for every max-pooling module and option, and a call that does not match its
record pools as usual."""

import contextlib

import pytest
import torch
from torch import nn

from dpbench.core.tasks import ClassificationTask
from dpbench.privatizers import jl as jl_module
from dpbench.privatizers.per_sample.forward_mode import pool as pool_rule
from tests.helpers.jl_projections import jl

pytestmark = pytest.mark.models_as_built

TASK = ClassificationTask()


class PoolingNet(nn.Module):
    """One max-pooling layer between two trainable ones, the input shaped for it; `twice` calls it a second time,
    at another shape."""

    def __init__(self, pool: nn.Module, dims: int, twice: bool = False):
        super().__init__()
        conv = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[dims]
        self.conv, self.pool, self.twice = conv(2, 3, 3, padding=1), pool, twice
        self.head = nn.LazyLinear(4)

    def forward(self, x):
        hidden = self.pool(torch.tanh(self.conv(x)))
        if self.twice:
            hidden = self.pool(hidden)
        return self.head(hidden.flatten(1))


POOLS = {
    "2d 2/1": (lambda: nn.MaxPool2d(2, 1), 2, (9, 9)),
    "2d 3/2 padding 1 ceil": (lambda: nn.MaxPool2d(3, 2, padding=1, ceil_mode=True), 2, (8, 7)),
    "2d dilation 2": (lambda: nn.MaxPool2d(2, 1, dilation=2), 2, (8, 8)),
    "1d 3/2": (lambda: nn.MaxPool1d(3, 2), 1, (11,)),
    "3d 2/2": (lambda: nn.MaxPool3d(2, 2), 3, (4, 6, 6)),
}


@contextlib.contextmanager
def nothing_recorded(model):
    """The jvp passes pool as before this rule: nothing recorded, so nothing gathered."""
    yield {}


def _projections(model, batch, seed=3):
    strategy = jl(5, chunk_size=2, seed=seed)
    strategy.attach(model)
    losses, projected = strategy.projections(model, TASK, batch)
    return losses.detach(), projected


@pytest.mark.parametrize("twice", [False, True], ids=["once", "twice"])
@pytest.mark.parametrize("name", sorted(POOLS))
def test_projections_equal_those_of_pooling_again(name, twice, monkeypatch):
    build, dims, size = POOLS[name]
    torch.manual_seed(0)
    model = PoolingNet(build(), dims, twice).double()
    x = torch.randn(6, 2, *size, dtype=torch.float64)
    batch = (x, torch.randint(0, 4, (6,)))
    model(x)  # materialise the lazy head
    with monkeypatch.context() as patch:
        patch.setattr(jl_module, "recording_pools", nothing_recorded)
        expected_losses, expected = _projections(model, batch)
    pooled = []
    original = pool_rule._pool

    def counting(module, inputs, with_indices):
        pooled.append(with_indices)
        return original(module, inputs, with_indices)

    monkeypatch.setattr(pool_rule, "_pool", counting)
    losses, projected = _projections(model, batch)
    torch.testing.assert_close(losses, expected_losses, rtol=0, atol=0)
    torch.testing.assert_close(projected, expected, rtol=1e-12, atol=1e-12)
    calls = 2 if twice else 1
    assert pooled == [True] * calls  # the graph pass records every call; the jvp passes only gather


def test_a_call_that_does_not_match_its_record_pools_again():
    module = nn.MaxPool2d(2, 1)
    recorded = torch.randn(3, 2, 6, 6, dtype=torch.float64)
    _, indices = nn.functional.max_pool2d(recorded, 2, 1, return_indices=True)
    pools = pool_rule.GatheringPools({module: [((3, 2, 6, 6), indices)]})
    same = torch.randn(3, 2, 6, 6, dtype=torch.float64)
    torch.testing.assert_close(pools.forward(module, same), same.flatten(2).gather(2, indices.flatten(2)).view(
        indices.shape))
    other = torch.randn(3, 2, 7, 7, dtype=torch.float64)  # another shape, and no record left: pooled
    pools.rewind()
    pools.forward(module, same)
    torch.testing.assert_close(pools.forward(module, other), nn.functional.max_pool2d(other, 2, 1))
    pools.rewind()
    torch.testing.assert_close(pools.forward(module, other), nn.functional.max_pool2d(other, 2, 1))


def test_a_pool_that_returns_its_indices_is_left_alone():
    model = PoolingNet(nn.MaxPool2d(2, 1), 2)
    model.pool.return_indices = True
    with pool_rule.recording_pools(model) as records:
        assert records == {}
        assert "forward" not in vars(model.pool)
