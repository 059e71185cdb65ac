"""What a per-sample check counts as the model drawing random numbers: seeded ops on the global generators, not
fused attention at dropout 0 (CUDA's attention kernels are seeded ops) and not dpbench's own explicitly seeded draws."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dpbench.core.errors import UnsupportedModelError
from dpbench.core.tasks import ClassificationTask
from dpbench.privatizers.per_sample import HookEngine
from dpbench.privatizers.per_sample.verify import RandomDraws, as_trained_without_dropout
from tests.helpers.per_sample_reference import loop_gradients

pytestmark = pytest.mark.models_as_built

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
    (lambda: torch.rand([]), False),
    (lambda: torch.rand([1]), True),
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


class LayerDrop(nn.Module):
    """Skips its layer for the whole batch with probability p, one number drawn per call (as HF's OPT does)."""

    def __init__(self, p: float):
        super().__init__()
        self.p, self.layer, self.head = p, nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x):
        if self.training and torch.rand([]) < self.p:
            return self.head(x)
        return self.head(torch.tanh(self.layer(x)))


def test_a_number_drawn_for_the_whole_batch_is_the_same_in_every_pass_of_a_check():
    with as_trained_without_dropout(nn.Linear(2, 2)) as draws:
        first, second = torch.rand([]), torch.rand([])
    assert first == second and not draws.drawn()
    assert torch.rand([]) != torch.rand([])  # outside a check, the run's own draws


@pytest.mark.parametrize(("p", "seed"), [(0.0, 0), (0.5, 0), (0.9, 1)])
def test_a_layerdrop_model_keeps_the_hook_engine_with_exact_per_sample_gradients(p, seed):
    """The check runs on its own fixed number; the step's pass draws from the run's generator, as it would train."""
    batch = layerdrop_batch()
    model = LayerDrop(p).train()
    torch.manual_seed(seed)
    skipped = bool(torch.rand([]) < p)  # what the step's one forward will draw
    torch.manual_seed(seed)
    result = HookEngine(model).clipped_sum(ClassificationTask(), batch, 1e6)
    model.p = 1.0 if skipped else 0.0  # the same realisation for the reference, whatever it draws
    reference = loop_gradients(model, batch)
    torch.testing.assert_close(result.norms, torch.stack([
        torch.sqrt(sum(g.pow(2).sum() for g in r.values())) for r in reference]), atol=1e-5, rtol=1e-4)
    for name, _ in model.named_parameters():
        torch.testing.assert_close(result.grads[name], sum(r[name] for r in reference), atol=1e-5, rtol=1e-4)


def test_a_step_that_drops_other_layers_than_the_check_is_refused():
    """The check's fixed number kept the layer (0.5 > 0.3), the step's draw (0.004) drops it: the step is unchecked."""
    batch = layerdrop_batch()
    model = LayerDrop(0.3).train()
    torch.manual_seed(3)
    with pytest.raises(UnsupportedModelError, match="layer drop"):
        HookEngine(model).clipped_sum(ClassificationTask(), batch, 1e6)


def layerdrop_batch():
    torch.manual_seed(0)
    return torch.randn(6, 8), torch.randint(0, 3, (6,))
