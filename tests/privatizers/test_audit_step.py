"""The one-step distinguishing audit: honest privatizers stay below their claim; broken ones are caught."""

import math

import pytest
import torch
from omegaconf import OmegaConf

from dpbench.audit.gradient_canary import audit_step
from dpbench.core.tasks import ClassificationTask
from dpbench.privacy.randomness import PrivacyRandomness
from dpbench.privatizers import PrivacySettings, make_strategy
from dpbench.privatizers.vanilla import Vanilla

pytestmark = pytest.mark.models_as_built

SIGMA, CLIP = 2.0, 1.0


def model_factory() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.Tanh(), torch.nn.Linear(16, 5))


def batches():
    generator = torch.Generator().manual_seed(0)
    background = (torch.randn(15, 20, generator=generator), torch.randint(0, 5, (15,), generator=generator))
    canary_input = 30 * torch.randn(1, 20, generator=generator)  # a far-out sample: a huge gradient if unclipped
    return background, (canary_input, torch.tensor([model_factory()(canary_input).argmin()]))


def settings() -> PrivacySettings:
    return PrivacySettings(CLIP, 1.0, SIGMA, randomness=PrivacyRandomness(0))


class NoClipping(Vanilla):
    """Claims clip norm C, clips at infinity."""

    def accumulate(self, model, task, batch, ctx):
        self.privacy.clip_norm = 1e9
        try:
            return super().accumulate(model, task, batch, ctx)
        finally:
            self.privacy.clip_norm = CLIP


class TooLittleNoise(Vanilla):
    """Claims sigma, adds sigma / 10."""

    def write_noisy_mean(self, model, clipped_sums, ctx):
        self.privacy.noise_multiplier = SIGMA / 10
        try:
            super().write_noisy_mean(model, clipped_sums, ctx)
        finally:
            self.privacy.noise_multiplier = SIGMA


def run_audit(factory):
    background, canary = batches()
    return audit_step(factory, model_factory, ClassificationTask(), background, canary, trials=300)


@pytest.mark.parametrize(
    "config",
    [{"name": "vanilla"}, {"name": "jl", "projections": 30}, {"name": "grape"}, {"name": "dp_galore"},
     {"name": "d2p2"}, {"name": "dp2_sgd"}, {"name": "d2p_sgd"}],
    ids=lambda c: c["name"],
)
def test_every_privatizer_passes_the_audit(config):
    result = run_audit(lambda: make_strategy(OmegaConf.create(config), settings()))
    assert result.consistent and 1.0 < result.claimed_epsilon < 5.0


@pytest.mark.parametrize("broken", [NoClipping, TooLittleNoise])
def test_broken_privatizers_are_caught(broken):
    result = run_audit(lambda: broken(OmegaConf.structured({"name": "vanilla", "engine": "auto",
                                                            "chunk_size": None}), settings()))
    assert not result.consistent
    assert result.epsilon_lower_bound > result.claimed_epsilon


def test_sparse_passes_the_audit_through_its_own_update():
    from dpbench.core.optim import OptimizerConfig
    from dpbench.core.tasks import NegativeSamplingTask
    from dpbench.models.word2vec import Word2Vec
    from tests.helpers.models import w2v_batch

    background, _ = w2v_batch(40, 12, seed=1), None
    canary_inputs = {"center": torch.tensor([3]), "context": torch.tensor([[3, 3, 3, 3]]),
                     "negatives": torch.tensor([[3] * 8])}
    canary = (canary_inputs, torch.tensor([3]))

    def model_factory_w2v():
        torch.manual_seed(0)
        return Word2Vec(40, 6, init_std=3.0)  # large weights: a large, clipped canary gradient

    config = {"name": "sparse", "selection": "random", "sparsity": 0.5, "clip2": 1.0}
    result = audit_step(lambda: make_strategy(OmegaConf.create(config), settings()), model_factory_w2v,
                        NegativeSamplingTask(), background, canary, trials=300,
                        optimizer_config=OptimizerConfig(name="sgd", lr=1.0))
    assert result.consistent and math.isfinite(result.claimed_epsilon) and result.claimed_epsilon > 0.5


def test_each_trial_starts_from_a_fresh_optimizer(monkeypatch):
    """A deterministic step (non-private) under Adam: with fresh moments every trial of a world scores the same,
    while moments carried over from earlier trials would change each score."""
    import numpy as np

    import dpbench.audit.gradient_canary as audit
    from dpbench.core.optim import OptimizerConfig

    seen = {}

    def capture(out_scores, in_scores, delta, confidence):
        seen["out"], seen["in"] = out_scores, in_scores
        return 0.0, 0.0, 0.0

    monkeypatch.setattr(audit, "epsilon_lower_bound", capture)
    background, canary = batches()
    audit_step(lambda: make_strategy(OmegaConf.create({"name": "nonprivate"}), settings()), model_factory,
               ClassificationTask(), background, canary, trials=4,
               optimizer_config=OptimizerConfig(name="adam", lr=0.1))
    for world in ("out", "in"):
        np.testing.assert_allclose(seen[world], seen[world][0], rtol=1e-6)
    assert not np.isclose(seen["out"][0], seen["in"][0])
