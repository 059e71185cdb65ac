"""Accounting of the sparse privatizer's step: private coordinate selection and Gaussian noise, one Poisson sample.

Both parts of a step see the *same* Poisson sample, so they are accounted as one subsampled mechanism (composing
separately subsampled parts is not an upper bound in general). Its dominating pair before subsampling is the
product of `draws` randomized responses with epsilon `draw_epsilon` (any pure epsilon-DP mechanism is dominated by
randomized response: each exponential-mechanism draw, or each AboveThreshold round of the sparse vector technique)
and a Gaussian with noise multiplier sigma. After Poisson subsampling at rate q the privacy loss is
Y = log(1 - q + q e^S), with S = L_rr + L_gauss drawn from q P + (1 - q) Q: the convention of prv-accountant's
subsampled Gaussian (the "remove" pair). The distribution of S is a finite mixture (binomial counts of the
randomized responses) of Gaussians, so its cdf, and the RDP of Y at integer orders, are exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from prv_accountant.privacy_random_variables import PrivacyRandomVariable
from scipy import special, stats

from dpbench.privacy.mechanisms import Mechanism, register_mechanism
from dpbench.privacy.subsampling import log_subsampled_moment, loss_threshold

ATOM_MASS = 1e-30
"""Binomial atoms lighter than this (under both P and Q) are dropped: their mass is far below any delta error."""
SCRATCH_BYTES = 1 << 20
"""Size of each of the cdf's two (points x atoms) float64 scratch blocks (at least one point's row). Blocks of a fixed
number of points grew with the atoms: 330 MB per evaluation at word2vec's 40,000 draws (2,327 atoms), resident in
the run's epoch-end accounting. Blocks of a fixed size bound it at any number of atoms, and at this size they stay
in cache: twice as fast as the 300 MB blocks."""


class SubsampledSelectionGaussianPRV(PrivacyRandomVariable):
    def __init__(self, sampling_rate: float, noise_multiplier: float | None, draw_epsilon: float, draws: int):
        self.q = float(sampling_rate)
        self.mu = None if noise_multiplier is None else 1.0 / float(noise_multiplier)
        self.eps = float(draw_epsilon)
        self.draws = int(draws) if draw_epsilon > 0 else 0
        j = np.arange(self.draws + 1)
        r = 1.0 / (1.0 + math.exp(-self.eps))  # Pr[truthful answer] of randomized response
        p_atoms, q_atoms = stats.binom.pmf(j, self.draws, r), stats.binom.pmf(j, self.draws, 1.0 - r)
        keep = np.maximum(p_atoms, q_atoms) > ATOM_MASS
        self.atoms = self.eps * (2 * j[keep] - self.draws)
        self.p_weights, self.q_weights = self.q * p_atoms[keep], (1.0 - self.q) * q_atoms[keep]
        order = np.argsort(self.atoms)
        self._sorted_atoms = self.atoms[order]
        self._cumulative = np.cumsum((self.p_weights + self.q_weights)[order])

    def _cdf_s(self, z: np.ndarray) -> np.ndarray:
        if self.mu is None:
            index = np.searchsorted(self._sorted_atoms, z, side="right")
            return np.where(index > 0, self._cumulative[np.maximum(index - 1, 0)], 0.0)
        out = np.zeros_like(z)
        half = self.mu**2 / 2
        rows = max(1, min(z.size, SCRATCH_BYTES // (self.atoms.itemsize * self.atoms.size)))
        shifted_rows, block_rows = np.empty((2, rows, self.atoms.size))  # the two blocks, reused chunk after chunk
        for start in range(0, z.size, rows):
            chunk = z[start : start + rows]
            shifted, block = shifted_rows[: chunk.size], block_rows[: chunk.size]
            np.subtract(chunk[:, None], self.atoms[None, :], out=shifted)
            for offset, weights in ((-half, self.p_weights), (half, self.q_weights)):
                np.add(shifted, offset, out=block)
                block /= self.mu
                out[start : start + rows] += special.ndtr(block, out=block) @ weights
        return out

    def cdf(self, t):
        t = np.asarray(t, dtype=np.float64)
        flat = t.reshape(-1)
        z = loss_threshold(self.q, flat)
        out = np.zeros_like(flat)
        finite = np.isfinite(z)
        out[finite] = self._cdf_s(z[finite])
        out[z == np.inf] = 1.0
        return np.clip(out, 0.0, 1.0).reshape(t.shape)

    def probability(self, a, b):
        """cdf(b) - cdf(a); on a grid of adjacent cells (b[i] == a[i+1]) the cdf is evaluated once per edge."""
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if a.ndim == 1 and a.size > 1 and np.array_equal(a[1:], b[:-1]):
            edges = self.cdf(np.concatenate([a, b[-1:]]))
            return edges[1:] - edges[:-1]
        return self.cdf(b) - self.cdf(a)

    def _log_mgf_p(self, lam: float) -> float:
        """log E_P[exp(lam S)] before subsampling."""
        value = 0.0
        if self.draws:
            r = 1.0 / (1.0 + math.exp(-self.eps))
            value += self.draws * np.logaddexp(math.log(r) + lam * self.eps, math.log1p(-r) - lam * self.eps)
        if self.mu is not None:
            value += self.mu**2 * (lam * lam + lam) / 2
        return float(value)

    def rdp(self, alpha: float) -> float:
        """Exact Renyi divergence D_alpha(qP + (1-q)Q || Q) at integer orders (fractional: the next integer)."""
        order = math.ceil(alpha)
        if order <= 1:
            order = 2
        if self.q == 0.0:
            return 0.0
        log_unsampled = np.array([self._log_mgf_p(j - 1.0) for j in range(order + 1)])  # E_Q[(P/Q)^j]
        return float(log_subsampled_moment(self.q, order, log_unsampled) / (order - 1))


@register_mechanism
@dataclass(frozen=True)
class SubsampledSelectionGaussian(Mechanism):
    """One sparse step: `draws` pure draw_epsilon-DP selections, then Gaussian noise (sigma; None: selection only)."""

    sampling_rate: float
    noise_multiplier: float | None
    draw_epsilon: float
    draws: int
    kind = "subsampled_selection_gaussian"

    def __post_init__(self) -> None:
        if not 0.0 <= self.sampling_rate <= 1.0:
            raise ValueError(f"sampling rate must lie in [0, 1], got {self.sampling_rate}")
        if self.noise_multiplier is not None and not self.noise_multiplier > 0:
            raise ValueError(f"the noise multiplier must be positive, got {self.noise_multiplier}")
        if self.draw_epsilon < 0 or self.draws < 0:
            raise ValueError("draw_epsilon and draws must be non-negative")
        if self.noise_multiplier is None and not (self.draw_epsilon and self.draws):
            raise ValueError("a step with neither selection nor noise is not a mechanism")

    def prv(self) -> PrivacyRandomVariable:
        return SubsampledSelectionGaussianPRV(self.sampling_rate, self.noise_multiplier, self.draw_epsilon, self.draws)

    @property
    def is_trivial(self) -> bool:
        return self.sampling_rate == 0.0


@dataclass(frozen=True)
class Theorem3Bound:
    """Zhang, Mironov, Hejazinia's Theorem 3 (strong composition), for comparison with the PRV figure."""

    epsilon: float
    delta_prime: float
    step_selection_epsilon: float
    assumption_holds: bool
    """b/n (eps' + sqrt(2 log(1.25/delta'))/sigma) <= 1/sqrt(T), under which the theorem's closed form applies."""
    lemmas_hold: bool
    """eps' + sqrt(2 log(1.25/delta'))/sigma <= 1: the proof's Lemma 1 (amplification) and Lemma 3 (Gaussian) need
    per-step epsilons of at most 1; beyond that the figure is not a valid bound."""


def theorem3_bound(sampling_rate: float, steps: int, sigma: float | None, draw_epsilon: float, draws: int,
                   delta: float) -> Theorem3Bound:
    """The paper's bound: per step eps' = eps'' sqrt(2 k log(1/delta')) (Algorithm 4), Gaussian (Lemma 3),
    amplification (Lemma 1), strong composition (Lemma 2) with delta = 4 q T delta'.

    `sigma` is the noise in units of the sensitivity the paper uses (min(S1/b, S2)); None: no noise.
    """
    delta_prime = delta / (4 * sampling_rate * steps)
    step_selection = draw_epsilon * math.sqrt(2 * draws * math.log(1 / delta_prime)) if draws else 0.0
    gaussian = math.sqrt(2 * math.log(1.25 / delta_prime)) / sigma if sigma else 0.0
    per_step = sampling_rate * (step_selection + gaussian)
    per_step_delta = 2 * sampling_rate * delta_prime
    epsilon = steps * per_step * math.expm1(per_step) + per_step * math.sqrt(
        2 * steps * math.log(1 / (steps * per_step_delta))
    )
    return Theorem3Bound(epsilon, delta_prime, step_selection, per_step <= 1 / math.sqrt(steps),
                         step_selection + gaussian <= 1 and gaussian <= 1)
