"""One-run audit (Steinke et al. 2023) through real multi-epoch runs: the honest pipeline stays below its claim;
noise derivable from the published config, and epochs that replay their batches, are caught."""

import math
from dataclasses import dataclass
from fractions import Fraction

import pytest
import torch
from scipy import stats
from torch.utils.data import DataLoader

from dpbench.app import run
from dpbench.audit.canary_run import audit_config
from dpbench.audit.one_run_audit import one_run_audit
from dpbench.audit.one_run_bound import epsilon_lower_bound, p_value
from dpbench.core.registry import Component
from dpbench.data import identity_collate
from dpbench.privatizers import STRATEGIES
from dpbench.privatizers.per_sample import trainable_parameters
from dpbench.privatizers.vanilla import Vanilla, VanillaConfig

SMALL = ["data.canaries=300", "data.real_size=300", "batch_size=30", "epochs=5", "privacy.noise_multiplier=1.35",
         "privacy.seed=2023"]
"""q = 0.05, 20 steps an epoch, 100 steps: a few seconds a run."""


def test_bound_matches_the_closed_form_without_delta():
    # all r guesses right, delta = 0: the bound solves p^r = beta, p = e^eps / (1 + e^eps)
    p = 0.05 ** (1 / 10)
    assert epsilon_lower_bound(10, 10, 10, 0.0, 0.05) == pytest.approx(math.log(p / (1 - p)), abs=1e-9)


def test_delta_term_matches_an_exact_computation():
    m, r, v, eps, delta = 6, 5, 4, 1.0, 0.01
    p = Fraction(math.exp(eps)) / (1 + Fraction(math.exp(eps)))
    pmf = [math.comb(r, k) * p**k * (1 - p) ** (r - k) for k in range(r + 1)]
    worst = max(sum(pmf[v - i : v]) / i for i in range(1, v + 1))
    assert p_value(m, r, v, eps, delta) == pytest.approx(float(sum(pmf[v:]) + 2 * m * delta * worst), rel=1e-12)


@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0, 4.0])
def test_bound_covers_randomized_response(eps):
    # eps-DP randomized response on r = 1000 canaries is right Binomial(r, e^eps / (1 + e^eps)) times: the bound
    # exceeds eps with probability at most beta = 5%, and not much less (the bound is tight for it)
    r = 1000
    low, first_above = 0, r  # bisection for the fewest right guesses whose bound exceeds eps
    while first_above - low > 1:
        middle = (low + first_above) // 2
        above = epsilon_lower_bound(r, r, middle, 0.0, 0.05) > eps
        low, first_above = (low, middle) if above else (middle, first_above)
    assert 0.02 < stats.binom.sf(first_above - 1, r, 1 / (1 + math.exp(-eps))) <= 0.05


@dataclass
class PublishedSeedConfig(VanillaConfig):
    name: str = "vanilla_published_seed"
    noise_seed: int = 0


class PublishedSeedNoise(Vanilla):
    """Noise from a generator seeded by a config value, which results.json publishes (finding 2's bug)."""

    name = "vanilla_published_seed"

    def write_noisy_mean(self, model, clipped_sums, ctx):
        if not hasattr(self, "generator"):
            self.generator = torch.Generator().manual_seed(self.config.noise_seed)
        std = self.noise_multiplier * self.privacy.clip_norm
        for name, param in trainable_parameters(model).items():
            total = clipped_sums.get(name, torch.zeros_like(param))
            noise = torch.randn(param.shape, generator=self.generator) * std
            param.grad = (total + noise) / ctx.expected_batch_size


class ReplayingDataModule(run.DPDataModule):
    """Every epoch repeats the first epoch's batches (finding 1's bug)."""

    def train_dataloader(self):
        first_epoch: list[list[int]] = []

        class Replay:
            def __init__(self, sampler):
                self.sampler = sampler

            def __len__(self):
                return len(self.sampler)

            def __iter__(self):
                if not first_epoch:
                    first_epoch.extend(self.sampler)
                return iter(first_epoch)

        replay = Replay(self.train_batch_sampler())
        return DataLoader(self.data.train, batch_sampler=replay, collate_fn=identity_collate)


def test_the_honest_pipeline_stays_below_its_claim(tmp_path):
    audit = one_run_audit(audit_config(SMALL), tmp_path, membership_seed=0)
    assert audit.steps == 100 and audit.epochs == 5
    assert audit.consistent, audit
    assert audit.epsilon_lower_bound < 0.75 * audit.claimed_epsilon


def test_noise_seeded_from_the_published_config_is_caught(tmp_path, monkeypatch):
    monkeypatch.setitem(STRATEGIES, PublishedSeedNoise.name, Component(PublishedSeedNoise, PublishedSeedConfig))
    audit = one_run_audit(audit_config([*SMALL, f"privatizer.name={PublishedSeedNoise.name}"]), tmp_path, 0)
    bounds = {a.attack: a for a in audit.attacks}
    assert bounds["shadow"].correct == bounds["shadow"].guesses  # the shadow run subtracts the noise exactly
    assert bounds["shadow"].epsilon_lower_bound > audit.claimed_epsilon, audit
    assert bounds["honest"].epsilon_lower_bound < audit.claimed_epsilon


@pytest.mark.slow
def test_epochs_that_replay_their_batches_are_caught_even_with_secret_noise(tmp_path, monkeypatch):
    monkeypatch.setattr(run, "DPDataModule", ReplayingDataModule)
    audit = one_run_audit(audit_config(["privacy.seed=2023"]), tmp_path, membership_seed=0)
    bounds = {a.attack: a for a in audit.attacks}
    assert bounds["replay"].epsilon_lower_bound > audit.claimed_epsilon, audit
    assert bounds["honest"].epsilon_lower_bound < audit.claimed_epsilon
