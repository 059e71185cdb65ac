"""D2P2 mechanics: automatic clipping bound, layer-wise projection = dense projection, the implicit sampler has the
explicit projection's law, noise wiring, reproducibility, RNG isolation."""

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from scipy import stats

from dpbench.core.errors import ConfigurationError
from dpbench.core.tasks import ClassificationTask
from dpbench.models.cnn import TFPrivacyCNN
from dpbench.privacy.randomness import PrivacyRandomness, PrivateStream
from dpbench.privatizers import PrivacySettings, make_strategy
from dpbench.privatizers.base import StepContext
from dpbench.privatizers.gaussian_projection import GaussianProjection
from dpbench.privatizers.implicit_projection import ImplicitProjection
from dpbench.privatizers.per_sample import trainable_parameters
from tests.helpers.models import CASES, cnn_batch

pytestmark = pytest.mark.models_as_built

TASK = ClassificationTask()


def strategy(name: str = "d2p2", sigma: float = 1.0, clip: float = 1.0, steps: int = 100, seed: int = 3, **overrides):
    settings = PrivacySettings(clip, 0.1, sigma, PrivacyRandomness(seed))
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
    shapes = {n: t.shape for n, t in params.items()}
    projection = GaussianProjection(shapes, p, PrivacyRandomness(5), max_block_elements=7 * p)
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
    projection = GaussianProjection(shapes, 64, PrivacyRandomness(0), max_block_elements=64 * 500)
    blocks = list(projection.blocks(0, torch.device("cpu")))
    assert len(blocks) == 600 and all(block.numel() <= 64 * 500 for _, _, block in blocks)


EMPTY = (torch.zeros(0, 30), torch.zeros(0, dtype=torch.long))


@pytest.mark.parametrize("name,dim", [("d2p2", 40), ("d2p_sgd", None)])
def test_noise_is_the_step_sigma_in_the_projected_space(name, dim):
    torch.manual_seed(0)
    model = torch.nn.Linear(30, 5)
    sigma, clip, expected, step = 2.0, 0.5, 8.0, 3
    d2p2 = strategy(name, sigma=sigma, clip=clip, dim=dim, projection="explicit")
    d2p2.attach(model)
    d2p2.privatize(model, TASK, EMPTY, StepContext(step, expected))  # noise only
    std = sigma / math.sqrt(step + 1) * clip  # sigma_k = sigma / sqrt(k), k = step + 1
    noise = PrivateStream(PrivacyRandomness(3), "noise")
    if dim is None:
        want = {n: noise.normal_like(p, std) / expected for n, p in model.named_parameters()}
    else:
        want = d2p2.projection.back(noise.normal_like(torch.zeros(dim), std), step)
        want = {n: t / expected for n, t in want.items()}
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[n])


def test_empty_batch_implicit_update_is_the_step_noise_mapped_back():
    """s = 0: the update is A z / sqrt(p), i.e. ||z|| / sqrt(p) times N(0, I_d), with z the step's sigma_k C noise."""
    torch.manual_seed(0)
    model = torch.nn.Linear(30, 5)
    sigma, clip, expected, step, dim = 2.0, 0.5, 8.0, 3, 40
    d2p2 = strategy(sigma=sigma, clip=clip, dim=dim)
    d2p2.attach(model)
    d2p2.privatize(model, TASK, EMPTY, StepContext(step, expected))
    z = PrivateStream(PrivacyRandomness(3), "noise").normal_like(torch.zeros(dim), sigma / math.sqrt(step + 1) * clip)
    d = sum(p.numel() for p in model.parameters())
    ratio = norm(p.grad * expected for p in model.parameters()) ** 2 * dim / float(z.pow(2).sum())
    assert abs(ratio - d) < 5 * math.sqrt(2 * d)  # chi-square with d degrees of freedom


SHAPES = {"weight": torch.Size([2, 2]), "bias": torch.Size([2])}
SUMS = {  # a clipped sum with a parameter left out (counts as zero), and the empty batch's zero sum
    "nonzero": {"weight": torch.tensor([[1.0, 0.5], [0.0, -1.0]])},
    "zero": {"weight": torch.zeros(2, 2), "bias": torch.zeros(2)},
}


def flat_update(update: dict) -> torch.Tensor:
    return torch.cat([update[name].reshape(-1) for name in SHAPES])


def implicit_draws(sums: dict, p: int, tau: float, draws: int) -> torch.Tensor:
    """`draws` updates u = A (A^T s / sqrt(p) + z) / sqrt(p), z ~ N(0, tau^2 I_p), one row each, sampled without A."""
    projection, noise = ImplicitProjection(SHAPES, p), PrivateStream(PrivacyRandomness(0), "noise")
    return torch.stack([flat_update(projection.release(sums, noise, tau, torch.device("cpu"))) for _ in range(draws)])


def explicit_draws(sums: dict, p: int, tau: float, draws: int) -> torch.Tensor:
    """The same with the seeded matrix of a fresh step each draw."""
    projection = GaussianProjection(SHAPES, p, PrivacyRandomness(1), max_block_elements=64)
    noise = PrivateStream(PrivacyRandomness(0), "noise")
    rows = []
    for step in range(draws):
        projected = projection.project(sums, step) + noise.normal_like(torch.zeros(p), tau)
        rows.append(flat_update(projection.back(projected, step)))
    return torch.stack(rows)


def flat_sum(sums: dict) -> torch.Tensor:
    return torch.cat([sums.get(name, torch.zeros(shape)).reshape(-1) for name, shape in SHAPES.items()])


@pytest.mark.parametrize("case", SUMS)
def test_implicit_release_has_the_explicit_projections_law(case):
    """Closed forms for u = A (A^T s / sqrt(p) + z) / sqrt(p): E[u] = s and Cov[u] = (tau^2 + ||s||^2 / p) I + s s^T / p
    (a Wishart second moment); both paths must meet them, and agree in law beyond two moments (chi-square tails)."""
    p, tau, draws = 2, 0.5, 4000
    sums, s = SUMS[case], flat_sum(SUMS[case])
    implicit, explicit = implicit_draws(sums, p, tau, draws), explicit_draws(sums, p, tau, draws)
    covariance = (tau**2 + s.dot(s) / p) * torch.eye(len(s)) + torch.outer(s, s) / p
    whitening = torch.linalg.inv(torch.linalg.cholesky(covariance))
    for sample in (implicit, explicit):
        assert sample.isfinite().all()
        assert (whitening @ (sample.mean(0) - s)).abs().max() < 4 / math.sqrt(draws)
        whitened = whitening @ torch.cov(sample.T) @ whitening.T
        assert (whitened - torch.eye(len(s))).abs().max() < 0.15  # heavy (chi-square) tails: wide sampling error
    direction = s / s.norm() if s.norm() > 0 else torch.eye(len(s))[0]
    perpendicular = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 0.0])  # bias, orthogonal to both sums
    for statistic in (lambda u: u @ direction, lambda u: u @ perpendicular, lambda u: u.norm(dim=1)):
        assert stats.ks_2samp(statistic(implicit).numpy(), statistic(explicit).numpy()).pvalue > 1e-3


def test_a_gaussian_with_the_right_moments_fails_the_law_check():
    """The two-sample check above can fail: a Gaussian with u's mean and covariance lacks its chi-square skew."""
    p, tau, draws = 2, 0.5, 4000
    sums, s = SUMS["nonzero"], flat_sum(SUMS["nonzero"])
    implicit = implicit_draws(sums, p, tau, draws)
    covariance = (tau**2 + s.dot(s) / p) * torch.eye(len(s)) + torch.outer(s, s) / p
    torch.manual_seed(0)
    gaussian = torch.distributions.MultivariateNormal(s, covariance).sample((draws,))
    assert stats.ks_2samp((implicit @ s).numpy(), (gaussian @ s).numpy()).pvalue < 1e-6


def test_implicit_draws_are_fresh_even_at_a_repeated_step():
    """t and w stand for A seen from this s: reusing them for another sum (as re-running a step index would with
    step-seeded draws) is not the mechanism. Each call must draw them anew, as the audit's repeated step 0 needs."""
    model = torch.nn.Linear(30, 5)
    d2p2 = strategy(dim=40)
    d2p2.attach(model)
    first, second = updates(d2p2, model, EMPTY, [0, 0])
    assert abs(float(torch.nn.functional.cosine_similarity(first, second, dim=0))) < 0.5


def updates(made, model, batch, steps) -> torch.Tensor:
    """The privatized gradients of `steps` consecutive logical steps on the same batch, one row each."""
    rows = []
    for step in steps:
        made.privatize(model, TASK, batch, StepContext(step, 4.0))
        rows.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    return torch.stack(rows)


def test_implicit_and_explicit_strategies_agree_in_law_on_a_tiny_model():
    """The strategy's whole noising step (noise stream, projection, scaling) on one clipped sum, many steps."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    batch = (torch.randn(4, 3), torch.tensor([0, 1, 1, 0]))
    draws = 1500
    samples = {}
    for projection in ("implicit", "explicit"):
        made = strategy("dp2_sgd", sigma=0.3, steps=draws, dim=2, noise_decay="none", projection=projection)
        made.attach(model)
        made.accumulate(model, TASK, batch, StepContext(0, 4.0))  # once: the per-sample pass is not under test
        clipped_sum, rows = dict(made._sums), []
        for step in range(draws):
            made._sums = dict(clipped_sum)
            made.finalize(model, StepContext(step, 4.0))
            rows.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
        samples[projection] = torch.stack(rows)
    mean = samples["explicit"].mean(0)
    assert mean.norm() > 0.05  # the clipped sum is not lost in the noise
    for statistic in (lambda u: u @ mean, lambda u: u[:, 0], lambda u: u.norm(dim=1)):
        pair = [statistic(samples[projection]).numpy() for projection in ("implicit", "explicit")]
        assert stats.ks_2samp(*pair).pvalue > 1e-3


def test_implicit_sampling_is_reproducible_from_the_seed_and_the_checkpoint():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    batch = (torch.randn(4, 3), torch.tensor([0, 1, 1, 0]))

    def run(seed: int, steps, state: dict | None = None):
        made = strategy(dim=16, seed=seed)
        made.attach(model)
        if state is not None:
            made.load_state_dict(state)
        return made, updates(made, model, batch, steps)

    first, both = run(3, range(2))
    torch.testing.assert_close(run(3, range(2))[1], both, rtol=0, atol=0)
    assert not torch.allclose(both[0], both[1])  # a fresh projection every step
    assert not torch.allclose(run(4, range(2))[1], both)
    resumed, _ = run(3, range(1))
    torch.testing.assert_close(run(3, range(1, 2), resumed.state_dict())[1][0], both[1], rtol=0, atol=0)


@pytest.mark.parametrize("overrides,kind", [
    ({}, ImplicitProjection),
    ({"projection": "implicit"}, ImplicitProjection),
    ({"projection": "explicit"}, GaussianProjection),
    ({"clip_after_projection": True}, GaussianProjection),
])
def test_projection_auto_is_implicit_unless_clipping_after_projection(overrides, kind):
    made = strategy(dim=8, **overrides)
    made.attach(torch.nn.Linear(3, 2))
    assert isinstance(made.projection, kind)
    assert made.privacy_report(100, 1e-5)["projection"] == ("implicit" if kind is ImplicitProjection else "explicit")


@pytest.mark.parametrize("overrides", [{}, {"projection": "explicit"}, {"clip_after_projection": True}])
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
    ("d2p2", {"projection": "dense"}, "projection must be one of"),
    ("d2p2", {"projection": "implicit", "clip_after_projection": True}, "projection=explicit"),
    ("dp2_sgd", {"noise_decay": "inverse_sqrt"}, "constant noise"),
])
def test_bad_settings_are_clear_errors(name, overrides, message):
    with pytest.raises(ConfigurationError, match=message):
        strategy(name, **overrides)
