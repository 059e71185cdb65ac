"""What a per-sample check counts as the model drawing random numbers: seeded ops on the global generators, not
fused attention at dropout 0 (CUDA's attention kernels are seeded ops) and not dpbench's own explicitly seeded draws."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dpbench.privatizers.per_sample.verify import RandomDraws, as_trained_without_dropout

Q = K = V = torch.randn(2, 2, 5, 8)


def flash_cpu(dropout_p: float):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(Q, K, V, dropout_p)


@pytest.mark.parametrize(("draw", "drawn"), [
    (lambda: torch.randn(3), True),
    (lambda: torch.bernoulli(torch.full((3,), 0.5)), True),
    (lambda: torch.randn(3, generator=torch.Generator().manual_seed(0)), False),
    (lambda: flash_cpu(0.0), False),
    (lambda: torch.randn(3).sum() * 0, True),
    (lambda: F.scaled_dot_product_attention(Q, K, V), False),
])
def test_random_draws_are_seeded_ops_on_the_global_generators(draw, drawn):
    with RandomDraws() as draws:
        draw()
    assert draws.drawn() == drawn, draws.ops


class NoisyLayer(nn.Module):
    def forward(self, x):
        return x + torch.randn_like(x) if self.training else x


def test_a_check_sees_a_noise_layer_and_no_attention_or_dropout():
    model = nn.Sequential(nn.Dropout(0.5), nn.Linear(8, 8)).train()
    x = torch.randn(2, 5, 8)
    with as_trained_without_dropout(model) as draws:
        model(x)
        F.scaled_dot_product_attention(Q, K, V, dropout_p=0.3)
    assert not draws.drawn(), draws.ops
    with as_trained_without_dropout(NoisyLayer().train()) as draws:
        NoisyLayer().train()(x)
    assert draws.ops == ["aten::randn_like"]
