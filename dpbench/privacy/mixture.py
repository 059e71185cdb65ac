"""Poisson-subsampled Gaussian whose noise multiplier is random: sigma * (chi2_df / df) ** (exponent / 2).

This is the per-step privacy random variable of DP-SGD-JL (Bu et al. 2021, Theorem 2.2-2.3 and B.7: norms estimated
from r JL projections, so the sensitivity is C * sqrt(r / chi2_r), exponent +1, df = r) and of projecting before
noising (D2P2: sensitivity sqrt(chi2_p / p), exponent -1, df = p). As in Theorem B.7 the random scale is treated as
revealed, so the PRV is the mixture over the chi-square law of subsampled-Gaussian PRVs (Theorem 2.3's X_p, Y_p).

The mixture is discretised so that it can only over-state the privacy loss:
- the chi-square law is cut into bins (geometric towards the dangerous tail, uniform in the bulk), and each bin's
  mass takes the *smallest* effective noise multiplier of its bin (a dominating component);
- the extreme tail where the effective noise multiplier falls below `sigma_floor` (mass eta) is replaced by the
  mechanism that reveals the sample outright whenever it is sampled: loss +inf with probability q*eta (pm_inf) and
  log(1 - q) otherwise.
The CDF is vectorized over components (one numpy pass per chunk), so 1,500 composed steps take seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from prv_accountant.privacy_random_variables import PrivacyRandomVariable
from scipy import special, stats

from dpbench.privacy.mechanisms import Mechanism, register_mechanism

MIN_TAIL_MASS = 1e-15
SIGMA_FLOOR = 0.2
GEOMETRIC_RATIO = 1.5
FAR_TAIL_END, FAR_TAIL_RATIO = 1e-6, 4.0
GEOMETRIC_END = 0.05
BULK_BINS = 40


def _log_a_integer(q: float, sigmas: np.ndarray, alpha: int) -> np.ndarray:
    """log A_alpha of the subsampled Gaussian (Mironov et al. 2019) for integer alpha, vectorized over sigma."""
    if q >= 1.0:
        return (alpha * alpha - alpha) / (2 * sigmas**2)
    i = np.arange(alpha + 1)
    log_binom = special.gammaln(alpha + 1) - special.gammaln(i + 1) - special.gammaln(alpha - i + 1)
    base = log_binom + i * np.log(q) + (alpha - i) * np.log1p(-q)
    terms = base[None, :] + (i * i - i)[None, :] / (2 * sigmas[:, None] ** 2)
    return special.logsumexp(terms, axis=1)


def _geometric(start: float, stop: float, ratio: float) -> np.ndarray:
    """start * ratio**k for the k that stay below stop (empty when start >= stop)."""
    count = max(0, int(np.ceil(np.log(stop / start) / np.log(ratio))))
    return start * ratio ** np.arange(count)


class SubsampledGaussianMixturePRV(PrivacyRandomVariable):
    """Mixture of Poisson-subsampled Gaussian PRVs (remove direction, as prv-accountant's own PRV)."""

    def __init__(self, sampling_rate: float, sigmas: np.ndarray, weights: np.ndarray, tail_mass: float):
        self.q = float(sampling_rate)
        self.sigmas = np.asarray(sigmas, dtype=np.float64)
        self.weights = np.asarray(weights, dtype=np.float64)
        self.tail_mass = float(tail_mass)
        self._rdp_cache: dict[int, float] = {}

    @property
    def pm_inf(self) -> float:
        return self.q * self.tail_mass

    def _component_cdf(self, t: np.ndarray, sigmas: np.ndarray) -> np.ndarray:
        """sum_k w_k * P[L_k <= t] for a chunk of components; L_k = log(1 - q + q exp((x - 1/2) / s_k^2))."""
        q = self.q
        with np.errstate(divide="ignore"):
            valid = t > np.log1p(-q)
        safe_t = np.where(valid, t, 0.0)
        # z = log((e^t - (1 - q)) / q), written to stay accurate near t = log(1 - q) and for large t
        z = safe_t + np.log(-np.expm1(np.log1p(-q) - safe_t)) - np.log(q)
        s = sigmas[:, None]
        inner = q * special.ndtr(s * z - 0.5 / s) + (1 - q) * special.ndtr(s * z + 0.5 / s)
        return np.where(valid, inner, 0.0)

    def cdf(self, t):
        t = np.asarray(t, dtype=np.float64)
        flat = t.reshape(-1)
        total = np.zeros_like(flat)
        chunk = max(1, 2_000_000 // max(flat.size, 1))
        for start in range(0, self.sigmas.size, chunk):
            part = slice(start, start + chunk)
            total += self.weights[part] @ self._component_cdf(flat, self.sigmas[part])
        # the revealed tail: mass (1 - q) * eta at log(1 - q), q * eta at +inf (pm_inf, excluded here)
        if self.q < 1.0:
            total += np.where(flat >= np.log1p(-self.q), (1 - self.q) * self.tail_mass, 0.0)
        return (total / (1.0 - self.pm_inf)).reshape(t.shape)

    def probability(self, a, b):
        """Mass on [a, b] cell by cell; the discretiser's cells share edges, so each edge's CDF is computed once."""
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        edges = np.union1d(a, b)
        cdf = self.cdf(edges)
        return cdf[np.searchsorted(edges, b)] - cdf[np.searchsorted(edges, a)]

    def rdp(self, alpha: float) -> float:
        """RDP of the finite part at order ceil(alpha) (RDP grows with the order, so this bounds it)."""
        order = max(2, int(np.ceil(alpha)))
        if order not in self._rdp_cache:
            log_a = _log_a_integer(self.q, self.sigmas, order)
            mixed = special.logsumexp(log_a, b=self.weights) if self.weights.size else -np.inf
            self._rdp_cache[order] = float(mixed / (order - 1))
        return self._rdp_cache[order]


@register_mechanism
@dataclass(frozen=True)
class SubsampledGaussianMixture(Mechanism):
    """Gaussian noise sigma*C with a random sensitivity law, Poisson-sampled at rate q (see module docstring)."""

    sampling_rate: float
    noise_multiplier: float
    df: int
    exponent: float
    kind = "subsampled_gaussian_mixture"

    def __post_init__(self) -> None:
        if not 0.0 <= self.sampling_rate <= 1.0:
            raise ValueError(f"sampling rate must lie in [0, 1], got {self.sampling_rate}")
        if not self.noise_multiplier > 0.0:
            raise ValueError(f"a private step needs a positive noise multiplier, got {self.noise_multiplier}")
        if self.df < 1 or self.exponent not in (1.0, -1.0):
            raise ValueError(f"need df >= 1 and exponent +1 or -1, got df={self.df}, exponent={self.exponent}")

    @property
    def is_trivial(self) -> bool:
        return self.sampling_rate == 0.0

    def _effective_sigma(self, tail_probability: np.ndarray) -> np.ndarray:
        """Effective noise multiplier at the given probability from the dangerous tail of chi2_df / df."""
        law = stats.chi2(self.df)
        if self.exponent > 0:  # small chi-square -> small effective noise
            scale = law.ppf(tail_probability) / self.df
        else:  # large chi-square -> small effective noise
            scale = law.isf(tail_probability) / self.df
        return self.noise_multiplier * scale ** (self.exponent / 2)

    def tail_mass(self) -> float:
        """Probability that the effective noise multiplier is below SIGMA_FLOOR (at least MIN_TAIL_MASS)."""
        ratio = (SIGMA_FLOOR / self.noise_multiplier) ** (2 / self.exponent) * self.df
        law = stats.chi2(self.df)
        mass = law.cdf(ratio) if self.exponent > 0 else law.sf(ratio)
        return float(max(mass, MIN_TAIL_MASS))

    @cached_property
    def components(self) -> tuple[np.ndarray, np.ndarray, float]:
        eta = self.tail_mass()
        far = _geometric(eta, FAR_TAIL_END, FAR_TAIL_RATIO)
        near = _geometric(max(eta, FAR_TAIL_END), GEOMETRIC_END, GEOMETRIC_RATIO)
        bulk = np.linspace(max(GEOMETRIC_END, eta), 1.0, BULK_BINS + 1)
        edges = np.unique(np.concatenate([[eta], far, near, bulk]))
        weights = np.diff(edges)
        sigmas = self._effective_sigma(edges[:-1])  # each bin at its dangerous edge: dominates the bin
        return sigmas, weights, eta

    def prv(self) -> PrivacyRandomVariable:
        sigmas, weights, eta = self.components
        return SubsampledGaussianMixturePRV(self.sampling_rate, sigmas, weights, eta)
