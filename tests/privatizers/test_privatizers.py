"""Vanilla DP-SGD mechanics: clipping bound (also for outliers), noise scale, empty batches, RNG isolation."""

import pytest
import torch
from omegaconf import OmegaConf

from dpbench.core.tasks import ClassificationTask
from dpbench.models.cnn import TFPrivacyCNN
from dpbench.privacy.randomness import PrivacyRandomness
from dpbench.privatizers import PrivacySettings, make_strategy
from dpbench.privatizers.base import StepContext
from dpbench.privatizers.per_sample import HookEngine
from tests.helpers.models import CASES, cnn_batch

pytestmark = pytest.mark.models_as_built

TASK = ClassificationTask()


def vanilla(sigma: float, clip: float = 1.0, seed: int = 0, engine: str = "auto"):
    settings = PrivacySettings(clip, 0.1, sigma, PrivacyRandomness(seed))
    return make_strategy(OmegaConf.create({"name": "vanilla", "engine": engine}), settings)


@pytest.mark.parametrize("engine", ["hooks", "functorch"])
def test_each_clipped_contribution_is_bounded_even_for_a_huge_outlier(engine):
    torch.manual_seed(0)
    model = TFPrivacyCNN(activation="relu")
    inputs, targets = cnn_batch(8)
    inputs[3] *= 1e6  # an outlier whose gradient norm is enormous: confidently wrong
    targets[3] = model(inputs[3:4]).argmin()
    clip = 0.7
    strategy = vanilla(sigma=1.0, clip=clip, engine=engine)
    strategy.attach(model)
    norms = strategy.engine.clipped_sum(TASK, (inputs, targets), clip).norms
    assert norms[3] > 1e3 * clip
    for i in range(8):  # each sample's contribution alone: the clipped sum of a one-sample batch
        alone = strategy.engine.clipped_sum(TASK, (inputs[i : i + 1], targets[i : i + 1]), clip)
        contribution = torch.sqrt(sum(g.pow(2).sum() for g in alone.grads.values()))
        assert contribution <= clip * (1 + 1e-5)
    total = strategy.engine.clipped_sum(TASK, (inputs, targets), clip)
    assert torch.sqrt(sum(g.pow(2).sum() for g in total.grads.values())) <= 8 * clip * (1 + 1e-5)


def test_non_finite_samples_contribute_nothing():
    torch.manual_seed(0)
    model = CASES["cnn"][0]()
    inputs, targets = cnn_batch(6)
    engine = HookEngine(model)
    clean = engine.clipped_sum(TASK, (inputs[1:], targets[1:]), 1.0)
    inputs[0, 0, 0, 0] = float("nan")
    dirty = engine.clipped_sum(TASK, (inputs, targets), 1.0)
    assert not torch.isfinite(dirty.norms[0])
    for name, grad in clean.grads.items():
        torch.testing.assert_close(dirty.grads[name], grad)


def test_noise_has_standard_deviation_sigma_c_over_expected_batch():
    torch.manual_seed(0)
    model = torch.nn.Linear(500, 200)  # 100,200 coordinates: a tight estimate of the noise std
    sigma, clip, expected = 1.3, 0.5, 40.0
    strategy = vanilla(sigma, clip)
    strategy.attach(model)
    inputs, targets = torch.randn(16, 500), torch.randint(0, 200, (16,))
    clipped = strategy.engine.clipped_sum(TASK, (inputs, targets), clip).grads
    strategy.privatize(model, TASK, (inputs, targets), StepContext(0, expected))
    noise = torch.cat([(p.grad * expected - clipped[n]).flatten() for n, p in model.named_parameters()])
    assert abs(float(noise.mean())) < 0.02 * sigma * clip
    assert float(noise.std()) == pytest.approx(sigma * clip, rel=0.01)


def test_empty_batch_is_a_noise_only_step():
    model = torch.nn.Linear(50, 40)
    strategy = vanilla(sigma=2.0, clip=1.0)
    strategy.attach(model)
    empty = (torch.zeros(0, 50), torch.zeros(0, dtype=torch.long))
    output = strategy.privatize(model, TASK, empty, StepContext(0, 10.0))
    assert output.stats["batch_size"] == 0
    noise = torch.cat([p.grad.flatten() * 10.0 for p in model.parameters()])
    assert float(noise.std()) == pytest.approx(2.0, rel=0.1)


def test_noise_comes_from_its_own_seeded_generator(tiny_task):
    model, task, batch = tiny_task.model, tiny_task.task, tiny_task.batch
    weight = model[-1].weight
    grads = []
    for _ in range(2):
        torch.manual_seed(123)
        global_state = torch.get_rng_state()
        strategy = vanilla(sigma=1.0, seed=7)
        strategy.attach(model)
        strategy.privatize(model, task, batch, StepContext(0, 4.0))
        assert torch.equal(torch.get_rng_state(), global_state), "the global RNG must not be consumed"
        grads.append(weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])
    other = vanilla(sigma=1.0, seed=8)
    other.attach(model)
    other.privatize(model, task, batch, StepContext(0, 4.0))
    assert not torch.allclose(weight.grad, grads[0])


def test_every_trainable_parameter_gets_a_private_gradient_and_frozen_ones_none():
    model = CASES["sequence"][0]()
    model.layer_norm.weight.requires_grad_(False)
    strategy = vanilla(sigma=1.0)
    strategy.attach(model)
    strategy.privatize(model, TASK, CASES["sequence"][1](), StepContext(0, 5.0))
    for name, param in model.named_parameters():
        if param.requires_grad:
            assert param.grad is not None and torch.isfinite(param.grad).all(), name
        else:
            assert param.grad is None, name


@pytest.mark.parametrize("name", ["vanilla", "nonprivate"])
def test_micro_batches_give_the_same_step_with_noise_added_once(name):
    torch.manual_seed(0)
    batch = cnn_batch(10)
    grads = []
    for physical in (None, 3):
        torch.manual_seed(0)
        model = TFPrivacyCNN()
        settings = PrivacySettings(1.0, 0.1, 0.7, PrivacyRandomness(5))
        strategy = make_strategy(OmegaConf.create({"name": name}), settings)
        strategy.attach(model)
        output = strategy.privatize(model, TASK, batch, StepContext(0, 10.0, physical))
        assert output.stats["batch_size"] == 10
        grads.append([p.grad.clone() for p in model.parameters()])
    for whole, accumulated in zip(grads[0], grads[1], strict=True):
        torch.testing.assert_close(whole, accumulated, atol=1e-6, rtol=1e-5)
