"""D2P2 mechanics: automatic clipping bound, layer-wise projection = dense projection, noise wiring, RNG isolation."""

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from dpbench.errors import ConfigurationError
from dpbench.models.cnn import TFPrivacyCNN
from dpbench.privatizers import PrivacySettings, make_strategy
from dpbench.privatizers.base import StepContext
from dpbench.privatizers.gaussian_projection import GaussianProjection
from dpbench.privatizers.noise import GaussianNoise
from dpbench.privatizers.per_sample import trainable_parameters
from dpbench.tasks import ClassificationTask
from tests.models import CASES, cnn_batch

TASK = ClassificationTask()


def strategy(name: str = "d2p2", sigma: float = 1.0, clip: float = 1.0, steps: int = 100, **overrides):
    settings = PrivacySettings(clip_norm=clip, sampling_rate=0.1, noise_multiplier=sigma, seed=3)
    made = make_strategy(OmegaConf.create({"name": name, **overrides}), settings)
    made.prepare(None, steps, 1e-5, None, None)
    return made


def norm(tensors) -> float:
    return math.sqrt(sum(float(t.pow(2).sum()) for t in tensors))


@pytest.mark.parametrize("engine", ["hooks", "functorch"])
def test_automatic_clipping_bounds_every_contribution_below_c(engine):
    torch.manual_seed(0)
    model = TFPrivacyCNN(activation="relu")
    inputs, targets = cnn_batch(6)
    inputs[2] *= 1e6  # a huge outlier
    targets[2] = model(inputs[2:3]).argmin()
    clip, gamma = 0.7, 0.01
    d2p2 = strategy(clip=clip, gamma=gamma, engine=engine, dim=None, name="d2p_sgd")
    d2p2.attach(model)
    norms = []
    for i in range(6):  # each sample alone: its contribution is C g / (||g|| + gamma)
        alone = d2p2.engine.clipped_sum(TASK, (inputs[i : i + 1], targets[i : i + 1]), clip, d2p2_factors(gamma))
        contribution = norm(alone.grads.values())
        raw = float(alone.norms[0])
        assert contribution < clip
        assert contribution == pytest.approx(clip * raw / (raw + gamma), rel=1e-4)
        norms.append(raw)
    assert max(norms) > 1e3 and min(norms) < 10  # the bound holds far above and below C


def d2p2_factors(gamma: float):
    from functools import partial

    from dpbench.privatizers.clipping import automatic_clip_factors

    return partial(automatic_clip_factors, gamma=gamma)


def test_clipping_after_projection_bounds_each_projected_contribution():
    torch.manual_seed(0)
    model = TFPrivacyCNN()
    inputs, targets = cnn_batch(4)
    inputs[1] *= 1e4
    clip = 0.5
    d2p2 = strategy(clip=clip, dim=32, clip_after_projection=True)
    d2p2.attach(model)
    for i in range(4):
        d2p2.accumulate(model, TASK, (inputs[i : i + 1], targets[i : i + 1]), StepContext(0, 1.0))
        assert 0 < float(d2p2._projected_sum.norm()) < clip
        d2p2._projected_sum = None


def dense_matrix(projection: GaussianProjection, step: int) -> torch.Tensor:
    """A assembled from the seeded blocks, parameters stacked in order: what the layer-wise code must equal."""
    offsets, total = {}, 0
    for name, shape in projection.shapes.items():
        offsets[name] = total
        total += shape.numel()
    dense = torch.full((total, projection.dim), float("nan"))
    for name, rows, block in projection.blocks(step, torch.device("cpu")):
        dense[offsets[name] + rows.start : offsets[name] + rows.stop] = block
    assert not dense.isnan().any()
    return dense


def test_layerwise_projection_equals_a_dense_projection():
    torch.manual_seed(0)
    model = CASES["sequence"][0]()
    params = trainable_parameters(model)
    p = 24
    projection = GaussianProjection({n: t.shape for n, t in params.items()}, p, seed=5, max_block_elements=7 * p)
    assert any(shape.numel() > projection.rows_per_block for shape in projection.shapes.values())  # split layers
    dense = dense_matrix(projection, step=2)
    flat = lambda tensors: torch.cat([tensors[n].reshape(-1) for n in params])  # noqa: E731
    g = {name: torch.randn_like(t) for name, t in params.items()}
    torch.testing.assert_close(projection.project(g, 2), dense.T @ flat(g) / math.sqrt(p))
    per_sample = {name: torch.randn(3, *t.shape) for name, t in params.items()}
    stacked = torch.cat([per_sample[n].reshape(3, -1) for n in params], dim=1)
    torch.testing.assert_close(projection.project(per_sample, 2), stacked @ dense / math.sqrt(p))
    y = torch.randn(p)
    torch.testing.assert_close(flat(projection.back(y, 2)), dense @ y / math.sqrt(p))
    # a fresh iid N(0, 1) matrix every step, over all layers at once
    assert dense.mean().abs() < 0.05 and (dense.std() - 1).abs() < 0.05
    assert not torch.allclose(dense, dense_matrix(projection, step=3))


def test_no_block_is_larger_than_the_limit():
    shapes = {"big": torch.Size([3000, 100])}
    projection = GaussianProjection(shapes, 64, seed=0, max_block_elements=64 * 500)
    blocks = list(projection.blocks(0, torch.device("cpu")))
    assert len(blocks) == 600 and all(block.numel() <= 64 * 500 for _, _, block in blocks)


@pytest.mark.parametrize("name,dim", [("d2p2", 40), ("d2p_sgd", None)])
def test_noise_is_the_step_sigma_in_the_projected_space(name, dim):
    torch.manual_seed(0)
    model = torch.nn.Linear(30, 5)
    sigma, clip, expected, step = 2.0, 0.5, 8.0, 3
    d2p2 = strategy(name, sigma=sigma, clip=clip, dim=dim)
    d2p2.attach(model)
    empty = (torch.zeros(0, 30), torch.zeros(0, dtype=torch.long))
    d2p2.privatize(model, TASK, empty, StepContext(step, expected))  # noise only
    std = sigma / math.sqrt(step + 1) * clip  # sigma_k = sigma / sqrt(k), k = step + 1
    noise = GaussianNoise(seed=3)
    if dim is None:
        want = {n: noise.sample_like(p, std) / expected for n, p in model.named_parameters()}
    else:
        want = d2p2.projection.back(noise.sample_like(torch.zeros(dim), std), step)
        want = {n: t / expected for n, t in want.items()}
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[n])


@pytest.mark.parametrize("overrides", [{}, {"clip_after_projection": True}])
def test_global_rng_state_is_untouched(overrides):
    model = TFPrivacyCNN()
    d2p2 = strategy(dim=16, **overrides)
    d2p2.attach(model)
    torch_state, numpy_state = torch.get_rng_state(), np.random.get_state()[1].copy()
    for step in range(2):
        d2p2.privatize(model, TASK, cnn_batch(4, seed=step), StepContext(step, 4.0))
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert np.array_equal(np.random.get_state()[1], numpy_state)


@pytest.mark.parametrize("name,overrides,message", [
    ("d2p2", {"gamma": 0.0}, "gamma"),
    ("d2p2", {"dim": 0}, "dim"),
    ("d2p2", {"noise_decay": "linear"}, "noise_decay"),
    ("d2p2", {"buckets": 0}, "buckets"),
    ("d2p_sgd", {"clip_after_projection": True}, "needs a projection"),
    ("d2p_sgd", {"dim": 64}, "does not project"),
    ("dp2_sgd", {"noise_decay": "inverse_sqrt"}, "constant noise"),
])
def test_bad_settings_are_clear_errors(name, overrides, message):
    with pytest.raises(ConfigurationError, match=message):
        strategy(name, **overrides)
