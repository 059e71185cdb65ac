"""D2P2 accounting: bucketed schedules upper-bound the exact per-step composition, constant schedules equal the
constant-noise accountant, the ledger composes the plan, and calibration hits its target."""

import math

import numpy as np
import pytest
from omegaconf import OmegaConf

from dpbench.core.config import PrivacyConfig
from dpbench.privacy import PrivacyAccountant, PrivacyLedger, SubsampledGaussian
from dpbench.privacy.mixture import SubsampledGaussianMixture
from dpbench.privacy.noise_schedule import NoiseSchedule
from dpbench.privacy.randomness import PrivacyRandomness
from dpbench.privatizers import PrivacySettings, make_strategy
from dpbench.privatizers.privacy_plan import make_plan

Q, DELTA = 0.05, 1e-5


def strategy(name: str, sigma: float | None = None, **overrides):
    settings = PrivacySettings(1.0, Q, sigma, PrivacyRandomness(0))
    return make_strategy(OmegaConf.create({"name": name, **overrides}), settings)


@pytest.mark.parametrize("decay", ["inverse_sqrt", "exponential", "none"])
@pytest.mark.parametrize("total,count", [(1, 4), (7, 3), (500, 12), (20_000, 8)])
def test_buckets_cover_every_step_at_no_more_than_its_noise(decay, total, count):
    schedule = NoiseSchedule(decay, 5.0)
    runs = schedule.buckets(total, count)
    assert 1 <= len(runs) <= count and runs[-1][0] == total
    factors = schedule.factors(np.arange(1, total + 1), total)
    start = 0
    for end, factor in runs:
        assert end > start and factor <= factors[start:end].min()
        start = end


def test_constant_schedules_equal_the_constant_noise_accountant():
    sigma, steps = 1.1, 300
    plain = [(SubsampledGaussian(Q, sigma), steps)]
    assert strategy("dp2_sgd", dim=64, clip_after_projection=True).composition(sigma, steps) == plain
    assert strategy("d2p_sgd", noise_decay="none").composition(sigma, steps) == plain
    assert strategy("dp2_sgd", dim=64).composition(sigma, steps) == [
        (SubsampledGaussianMixture(Q, sigma, 64, -1.0), steps)
    ]
    vanilla = strategy("vanilla").composition(sigma, steps)  # DP-SGD's constant-noise composition
    accountant = PrivacyAccountant()
    constant = strategy("d2p2", noise_decay="none", dim=None).composition(sigma, steps)
    assert accountant.epsilon(constant, DELTA) == accountant.epsilon(vanilla, DELTA)


@pytest.mark.parametrize("name,dim,steps", [("d2p_sgd", None, 8), ("d2p2", 32, 5)])
def test_bucketed_schedule_upper_bounds_the_exact_per_step_composition(name, dim, steps):
    sigma = 1.6
    d2p2 = strategy(name, dim=dim, buckets=2)
    exact = [(d2p2.mechanism(sigma / math.sqrt(k)), 1) for k in range(1, steps + 1)]
    bucketed = d2p2.composition(sigma, steps)
    assert len(bucketed) == 2 and sum(n for _, n in bucketed) == steps
    accountant = PrivacyAccountant(eps_error=0.02)
    exact_eps = accountant.epsilon(exact, DELTA)
    bucketed_eps = accountant.epsilon(bucketed, DELTA)
    assert exact_eps.method == bucketed_eps.method == "prv"
    assert bucketed_eps.epsilon_estimate > exact_eps.epsilon_estimate
    assert bucketed_eps.epsilon < 1.5 * exact_eps.epsilon  # loose, but not absurdly so
    assert accountant.rdp_epsilon(bucketed, DELTA) > accountant.rdp_epsilon(exact, DELTA)


def test_the_ledger_composes_the_planned_buckets_and_the_noise_is_never_below_them():
    steps, sigma = 240, 20.0
    d2p2 = strategy("d2p2", sigma, dim=128)
    d2p2.prepare(None, steps, DELTA, None, None)
    ledger = PrivacyLedger(DELTA)
    for step in range(steps):
        (mechanism,) = d2p2.step_mechanisms(step)
        assert mechanism.noise_multiplier <= d2p2.step_noise_multiplier(step)
        ledger.record([mechanism])
    assert ledger.composition() == d2p2.composition(sigma, steps)
    assert len(ledger.composition()) == 12
    assert d2p2.step_noise_multiplier(steps - 1) == pytest.approx(sigma / math.sqrt(steps))


def test_calibration_hits_the_target_under_the_whole_schedule():
    d2p2 = strategy("d2p2", dim=256, buckets=2)
    config = PrivacyConfig(epsilon=2.0, delta=DELTA, accountant_eps_error=0.02)
    plan = make_plan(d2p2, config, Q, 40, model=object())
    assert config.epsilon * 0.995 <= plan.planned_epsilon <= config.epsilon
    assert d2p2.noise_multiplier == plan.noise_multiplier
    last = d2p2.composition(plan.noise_multiplier, 40)[-1][0]
    assert isinstance(last, SubsampledGaussianMixture) and last.noise_multiplier < plan.noise_multiplier
