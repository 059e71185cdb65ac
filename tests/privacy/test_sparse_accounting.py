"""Accounting of the sparse step (selection + noise on one Poisson sample) against hand computations."""

import math
import tracemalloc

import numpy as np
import pytest
from omegaconf import OmegaConf
from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism
from scipy import integrate, optimize, stats
from scipy.special import ndtr

from dpbench.models.word2vec import Word2Vec
from dpbench.privacy import sparse_step_accounting
from dpbench.privacy.accountant import PrivacyAccountant
from dpbench.privacy.randomness import PrivacyRandomness
from dpbench.privacy.sparse_step_accounting import (
    SubsampledSelectionGaussian,
    SubsampledSelectionGaussianPRV,
    theorem3_bound,
)
from dpbench.privatizers import PrivacySettings, make_strategy

ACCOUNTANT = PrivacyAccountant(eps_error=0.01)


def test_without_selection_it_is_prv_accountants_subsampled_gaussian():
    ours, theirs = SubsampledSelectionGaussianPRV(0.02, 0.9, 0.0, 0), PoissonSubsampledGaussianMechanism(0.02, 0.9)
    t = np.linspace(-1, 6, 57)
    np.testing.assert_allclose(ours.cdf(t), theirs.cdf(t).astype(float), atol=1e-12)
    for alpha in (2, 5, 32):
        assert ours.rdp(alpha) == pytest.approx(theirs.rdp(alpha), rel=1e-9)


def _epsilon_from_delta(delta_of: callable, delta: float) -> float:
    return optimize.brentq(lambda e: delta_of(e) - delta, 0.0, 50.0)


def test_selection_alone_composes_like_randomized_response_by_hand():
    """q = 1: T steps of k draws = n randomized responses; delta(eps) from the binomial distribution exactly."""
    draw_epsilon, draws, steps, delta = 0.05, 20, 30, 1e-5
    n = draws * steps
    r = 1 / (1 + math.exp(-draw_epsilon))
    x = np.arange(n + 1)
    loss = draw_epsilon * (2 * x - n)
    p_mass, q_mass = stats.binom.pmf(x, n, r), stats.binom.pmf(x, n, 1 - r)

    def exact_delta(eps: float) -> float:
        return float(np.sum(np.where(loss > eps, p_mass - math.exp(eps) * q_mass, 0.0)))

    expected = _epsilon_from_delta(exact_delta, delta)
    report = ACCOUNTANT.epsilon([(SubsampledSelectionGaussian(1.0, None, draw_epsilon, draws), steps)], delta)
    assert expected <= report.epsilon <= expected + 0.03  # an upper bound, within the discretisation error


def test_one_step_of_selection_and_noise_by_hand():
    """q = 1, one step: delta(eps) = sum_j Pr[j] * (Gaussian hockey-stick shifted by the selection's loss a_j)."""
    draw_epsilon, draws, sigma, delta = 0.2, 8, 1.5, 1e-5
    mu = 1 / sigma
    r = 1 / (1 + math.exp(-draw_epsilon))
    j = np.arange(draws + 1)
    shift, weight = draw_epsilon * (2 * j - draws), stats.binom.pmf(j, draws, r)

    def exact_delta(eps: float) -> float:
        e = eps - shift
        return float(np.sum(weight * (ndtr(-e / mu + mu / 2) - np.exp(e) * ndtr(-e / mu - mu / 2))))

    expected = _epsilon_from_delta(exact_delta, delta)
    report = ACCOUNTANT.epsilon([(SubsampledSelectionGaussian(1.0, sigma, draw_epsilon, draws), 1)], delta)
    assert expected <= report.epsilon <= expected + 0.03
    gaussian_only = ACCOUNTANT.epsilon([(SubsampledSelectionGaussian(1.0, sigma, 0.0, 0), 1)], delta).epsilon
    assert report.epsilon > gaussian_only + 0.5  # the selection is paid for


def test_rdp_with_selection_matches_numerical_integration():
    q, sigma, draw_epsilon, draws, alpha = 0.1, 1.2, 0.3, 4, 3
    prv = SubsampledSelectionGaussianPRV(q, sigma, draw_epsilon, draws)
    mu = 1 / sigma
    r = 1 / (1 + math.exp(-draw_epsilon))
    density = stats.norm(-mu**2 / 2, mu).pdf
    total = 0.0
    for j in range(draws + 1):  # E_Q[(1 - q + q e^S)^alpha], S = a_j + Gaussian loss, under Q
        a_j, weight = draw_epsilon * (2 * j - draws), stats.binom.pmf(j, draws, 1 - r)
        value, _ = integrate.quad(lambda s, a=a_j: (1 - q + q * math.exp(a + s)) ** alpha * density(s), -30, 30)
        total += weight * value
    assert prv.rdp(alpha) == pytest.approx(math.log(total) / (alpha - 1), rel=1e-6)


def test_prv_epsilon_is_tighter_than_theorem3_where_theorem3_is_valid():
    q, steps, sigma, draw_epsilon, draws, delta = 1e-3, 2000, 8.0, 0.005, 20, 1e-5
    ours = ACCOUNTANT.epsilon([(SubsampledSelectionGaussian(q, sigma, draw_epsilon, draws), steps)], delta).epsilon
    paper = theorem3_bound(q, steps, sigma, draw_epsilon, draws, delta)
    assert paper.assumption_holds and paper.lemmas_hold
    assert 0 < ours < paper.epsilon


def test_theorem3_is_flagged_where_its_lemmas_do_not_apply():
    """The paper's sigma = 0.5 (q = 1e-4, 20 epochs): the Gaussian step alone has epsilon > 1 before amplification."""
    bound = theorem3_bound(1e-4, 200_000, 0.5, 0.001, 100, 1e-5)
    assert not bound.lemmas_hold


def test_theorem3_bound_by_hand():
    q, steps, sigma, draw_epsilon, draws, delta = 1e-4, 100, 2.0, 0.01, 10, 1e-5
    delta_prime = delta / (4 * q * steps)
    per_step = q * (draw_epsilon * math.sqrt(2 * draws * math.log(1 / delta_prime))
                    + math.sqrt(2 * math.log(1.25 / delta_prime)) / sigma)
    expected = steps * per_step * (math.exp(per_step) - 1) + per_step * math.sqrt(2 * steps * math.log(2 / delta))
    assert theorem3_bound(q, steps, sigma, draw_epsilon, draws, delta).epsilon == pytest.approx(expected)


def test_calibration_gives_the_selection_its_budget_and_the_noise_the_rest():
    from dpbench.core.config import PrivacyConfig
    from dpbench.privatizers.privacy_plan import make_plan

    q, steps = 0.01, 200
    strategy = make_strategy(
        OmegaConf.create({"name": "sparse", "sparsity": 0.01, "selection_epsilon": 1.0}),
        PrivacySettings(1.0, q, None, randomness=PrivacyRandomness(0)),
    )
    model = Word2Vec(50, 4)
    plan = make_plan(strategy, PrivacyConfig(epsilon=3.0, delta=1e-5), q, steps, model)
    assert strategy.draws == 2
    selection = SubsampledSelectionGaussian(q, None, strategy.draw_epsilon, strategy.draws)
    spent = ACCOUNTANT.epsilon([(selection, steps)], 1e-5).epsilon
    assert 0.97 <= spent <= 1.0
    assert 2.9 <= plan.planned_epsilon <= 3.0
    joint = SubsampledSelectionGaussian(q, plan.noise_multiplier, strategy.draw_epsilon, strategy.draws)
    assert strategy.composition(plan.noise_multiplier, steps) == [(joint, steps)]
    noise_alone = ACCOUNTANT.epsilon([(SubsampledSelectionGaussian(q, plan.noise_multiplier, 0, 0), steps)], 1e-5)
    # One Poisson sample feeds both parts: their losses add before amplification, so the joint figure exceeds
    # each part (here even their sum: large per-step losses amplify less).
    assert spent < plan.planned_epsilon and noise_alone.epsilon < plan.planned_epsilon


def test_epsilon_30_word2vec_setting_stays_on_the_prv_path():
    """The sparse_word2vec experiment's setting (k = 200 draws, eps'' 0.19, q = 0.001, 2,000 steps): its loss domain
    (+-900) is wide, but the grid at eps_error 0.1 fits, so the figure is the PRV one, far below the RDP bound."""
    mechanism = SubsampledSelectionGaussian(0.001, 0.4, 0.1879, 200)
    report = PrivacyAccountant(eps_error=0.1).epsilon([(mechanism, 2000)], 1e-5)
    assert report.method == "prv"
    assert 25.0 < report.epsilon < 35.0
    assert report.epsilon < PrivacyAccountant.rdp_epsilon([(mechanism, 2000)], 1e-5) / 5


WORD2VEC_SPARSE = SubsampledSelectionGaussian(0.0112, 1.01, 0.0036, 40_000)
"""The leaderboard's sparse word2vec cell at epsilon 3: sparsity 0.2 of 200K coordinates is 40,000 draws a step,
whose binomial law keeps 2,327 atoms; its cdf was evaluated in 330 MB blocks at each epoch end (issue 24 item 6)."""


class _AtomByAtomPRV(SubsampledSelectionGaussianPRV):
    """The same cdf without blocks: one atom at a time over the points (all atoms at once for a few points)."""

    def _cdf_s(self, z: np.ndarray) -> np.ndarray:
        half = self.mu**2 / 2
        if z.size <= 64:
            shifted = z[:, None] - self.atoms[None, :]
            return ndtr((shifted - half) / self.mu) @ self.p_weights + ndtr((shifted + half) / self.mu) @ self.q_weights
        total = np.zeros_like(z)
        for atom, p_weight, q_weight in zip(self.atoms, self.p_weights, self.q_weights, strict=True):
            total += p_weight * ndtr((z - atom - half) / self.mu) + q_weight * ndtr((z - atom + half) / self.mu)
        return total


class _AtomByAtom(SubsampledSelectionGaussian):
    def prv(self) -> SubsampledSelectionGaussianPRV:
        return _AtomByAtomPRV(self.sampling_rate, self.noise_multiplier, self.draw_epsilon, self.draws)


def test_blocks_of_any_size_give_the_epsilon_of_the_unblocked_cdf_in_bounded_memory(monkeypatch):
    """Chunking the cdf by bytes changes how much the accountant holds at once, never its figure: from one point a
    block to the default, the epsilon is the one of the same law summed atom by atom (no blocks), up to round-off,
    and the whole accountant call peaks at its two blocks plus a few MB (the grid, the FFT)."""
    steps, delta = 100, 1e-6
    accountant = PrivacyAccountant(eps_error=0.1)
    reference = accountant.epsilon([(_AtomByAtom(**vars(WORD2VEC_SPARSE)), steps)], delta)
    row = 8 * WORD2VEC_SPARSE.prv().atoms.size
    for scratch_bytes in (1, 37 * row + 5, sparse_step_accounting.SCRATCH_BYTES):
        monkeypatch.setattr(sparse_step_accounting, "SCRATCH_BYTES", scratch_bytes)
        tracemalloc.start()
        try:
            report = accountant.epsilon([(WORD2VEC_SPARSE, steps)], delta)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert report.method == reference.method == "prv"
        assert report.epsilon == pytest.approx(reference.epsilon, rel=1e-7), scratch_bytes
        assert report.epsilon_lower == pytest.approx(reference.epsilon_lower, rel=1e-7), scratch_bytes
        assert peak <= 2 * max(row, scratch_bytes) + (8 << 20), (scratch_bytes, f"{peak / 2**20:.1f} MB")


def test_the_cdf_scratch_is_bounded_by_bytes_not_by_points_times_atoms():
    """Two blocks of SCRATCH_BYTES plus a few arrays of the points' size, whatever the number of atoms: at word2vec's
    2,327 atoms on 6,000 points the unbounded evaluation held 335 MB."""
    prv = WORD2VEC_SPARSE.prv()
    t = np.linspace(-0.01, 4.0, 6000)
    expected = _AtomByAtomPRV(prv.q, 1 / prv.mu, prv.eps, prv.draws).cdf(t)
    tracemalloc.start()
    try:
        values = prv.cdf(t)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_allclose(values, expected, rtol=0, atol=1e-13)
    assert peak <= 2 * sparse_step_accounting.SCRATCH_BYTES + 16 * t.nbytes, f"{peak / 2**20:.1f} MB"
    assert prv.atoms.size * t.nbytes > 30 * sparse_step_accounting.SCRATCH_BYTES  # what the blocks save here
