"""Poisson-subsampled Gaussian whose noise multiplier is random: sigma * (chi2_df / df) ** (exponent / 2).

This is the per-step privacy random variable of DP-SGD-JL (Bu et al. 2021, Theorem 2.2-2.3 and B.7: norms estimated
from r JL projections, so the sensitivity is C * sqrt(r / chi2_r), exponent +1, df = r) and of projecting before
noising (D2P2: sensitivity sqrt(chi2_p / p), exponent -1, df = p). As in Theorem B.7 the random scale is treated as
revealed, so the PRV is the mixture over the chi-square law of subsampled-Gaussian PRVs (Theorem 2.3's X_p, Y_p).

The composed PRV can only over-state the privacy loss:
- the chi-square law is cut into bins (geometric in the effective noise multiplier and in probability towards the
  dangerous tail, uniform in probability in the bulk); each bin's mass takes the *smallest* effective noise
  multiplier of its bin, which dominates the bin (more noise is post-processing of less);
- the far tail (mass eta: below `REVEALED_BELOW_SIGMA`, whose losses pass any cap, or a sliver of the +inf
  budget) reveals the sample outright whenever it is sampled: loss +inf with probability q*eta and log(1 - q) otherwise;
- every privacy loss above a cap L is moved to +inf (pm_inf). Raising a loss raises delta(eps) for every eps, and
  the capped pair is dominating (an extra outcome absorbs the other side's mass there), so it composes.
The cap is chosen for the run being accounted (`accounting_prv`): the accountant grants each step a probability of
+inf (a small share of delta over all steps), and the cap is the smallest loss that keeps pm_inf within it. Below
the cap the mixture is kept exactly, so heavy chi-square tails (small r) give large but finite epsilons, and the
support of the finite part ends at the cap, which bounds the discretisation domain.
Each component's survival function is evaluated only on the grid points where it is neither 0 nor 1 to double
precision, so 1,500 composed steps take seconds; the mean that prv-accountant's discretisation preserves is
integrated per component (`mean`), not by adaptive quadrature over the long tail.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np
from prv_accountant.privacy_random_variables import PrivacyRandomVariable
from scipy import integrate, optimize, special, stats

from dpbench.privacy.mechanisms import Mechanism, register_mechanism
from dpbench.privacy.subsampling import log_subsampled_moments, log_sum_exp, loss_threshold

MAX_LOSS_CAP = 5_000.0
"""Largest finite loss kept; beyond it every loss counts as +inf (the domain, and the absolute error, scale with it)."""
REVEALED_BELOW_SIGMA = 0.005
"""Below this effective noise multiplier a sampled step's loss is about 1/(2 s^2) >= 2 * MAX_LOSS_CAP: revealed."""
MIN_CAP = 1.0
MIN_TAIL_MASS = 1e-15
REVEALED_SHARE = 0.01
"""Share of the +inf budget that the revealed far tail may use."""
SIGMA_RATIO = 1.01
GEOMETRIC_RATIO = 1.2
GEOMETRIC_END = 0.05
BULK_BINS = 40
WINDOW = 9.0
"""Standard deviations beyond which a Gaussian branch's tail (below 1e-19) is taken as 0 or 1."""
DENSE_POINTS = 256
"""Up to this many points the survival function is one dense pass over all components (quadrature, cap search)."""
MEAN_POINTS = 2000
ORDER_CHUNK = 16
"""Orders whose moments are computed in one array (components x orders x terms)."""
USELESS_RDP = 1e4
"""A step's Renyi DP beyond which no order is worth computing: its epsilon would exceed this (higher orders: +inf)."""
MGF_GRID = ((10.0, 4000), (100.0, 3000), (math.inf, 3000))
"""Grid on which the capped PRV's moment generating function is bounded: (up to loss, points) ..."""
MGF_FLOOR = -100.0
"""... from log(1 - q), or from here when q = 1 (the full-batch Gaussian's losses are unbounded below)."""


def _geometric(start: float, stop: float, ratio: float) -> np.ndarray:
    """start * ratio**k for the k that stay below stop (empty when start >= stop)."""
    count = max(0, int(np.ceil(np.log(stop / start) / np.log(ratio))))
    return start * ratio ** np.arange(count)


def _loss(q: float, x: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """Privacy loss log(1 - q + q exp((2x - 1) / (2 s^2))) at Gaussian output x."""
    exponent = (2 * x - 1) / (2 * sigma**2)
    return np.logaddexp(math.log1p(-q), math.log(q) + exponent) if q < 1.0 else exponent


def mixture_sf(q: float, sigmas: np.ndarray, weights: np.ndarray, t: np.ndarray) -> np.ndarray:
    """sum_k w_k P[L_k > t] at sorted t: L_k = log(1 - q + q exp((2x - 1) / (2 s^2))), x ~ (1-q)N(0,s^2) + qN(1,s^2).

    Each Gaussian branch is evaluated only within WINDOW standard deviations of its threshold (beyond, its tail is
    below 1e-19 and is taken as 0 or 1), so a component costs the grid points where its law changes."""
    z = loss_threshold(q, t)
    if z.size <= DENSE_POINTS:  # few points (quadrature, cap search): one dense pass beats the windows' loop
        s = sigmas[:, None]
        return weights @ (q * special.ndtr(0.5 / s - s * z) + (1 - q) * special.ndtr(-0.5 / s - s * z))
    total, steps = np.zeros(t.size), np.zeros(t.size + 1)
    for sigma, weight in zip(sigmas, weights, strict=True):
        for mass, shift in ((q, 0.5 / sigma), (1.0 - q, -0.5 / sigma)):  # sampled: N(1, s^2); not sampled: N(0, s^2)
            if mass > 0.0:
                low, high = np.searchsorted(z, [(shift - WINDOW) / sigma, (shift + WINDOW) / sigma])
                steps[0] += weight * mass
                steps[low] -= weight * mass
                total[low:high] += weight * mass * special.ndtr(shift - sigma * z[low:high])
    return np.maximum(total + np.cumsum(steps)[:-1], 0.0)


def _refine_ratio(edges: np.ndarray, ratio: float) -> np.ndarray:
    """Sorted positive edges with geometric points inserted wherever consecutive edges are more than `ratio` apart."""
    pieces = [edges[:1]]
    for low, high in zip(edges[:-1], edges[1:], strict=True):
        count = max(1, int(np.ceil(np.log(high / low) / np.log(ratio))))
        pieces.append(low * (high / low) ** (np.arange(1, count + 1) / count))
    return np.concatenate(pieces)


class SubsampledGaussianMixturePRV(PrivacyRandomVariable):
    """Mixture of Poisson-subsampled Gaussian PRVs (remove direction, as prv-accountant's own PRV), capped at
    `loss_cap`: the loss law conditioned on being finite, with pm_inf the mass moved to +inf."""

    def __init__(self, sampling_rate: float, sigmas: np.ndarray, weights: np.ndarray, revealed_mass: float,
                 loss_cap: float):
        self.q = float(sampling_rate)
        self.sigmas = np.asarray(sigmas, dtype=np.float64)
        self.weights = np.asarray(weights, dtype=np.float64)
        self.revealed_mass = float(revealed_mass)
        self.loss_cap = float(loss_cap)
        self.floor = math.log1p(-self.q) if self.q < 1.0 else -math.inf
        self._above_cap = float(mixture_sf(self.q, self.sigmas, self.weights, np.array([self.loss_cap]))[0])
        self._rdp_cache: dict[float, float] = {}

    @property
    def pm_inf(self) -> float:
        return self.q * self.revealed_mass + self._above_cap

    def sf(self, t) -> np.ndarray:
        """P[Y > t | Y finite], computed from the upper side so that tail cells keep their relative precision."""
        t = np.asarray(t, dtype=np.float64)
        flat = t.reshape(-1)
        order = np.argsort(flat, kind="stable")
        total = np.empty_like(flat)
        total[order] = mixture_sf(self.q, self.sigmas, self.weights, flat[order])
        total = np.maximum(total - self._above_cap, 0.0)
        total += np.where(flat < self.floor, (1 - self.q) * self.revealed_mass, 0.0)
        total = np.where(flat >= self.loss_cap, 0.0, total)
        return np.minimum(total / (1.0 - self.pm_inf), 1.0).reshape(t.shape)

    def cdf(self, t):
        return 1.0 - self.sf(t)

    def probability(self, a, b):
        """Mass on (a, b] cell by cell from survival values. On prv-accountant's grid (contiguous cells, whose
        long-double edges may differ in the last bit once in float64) each edge is evaluated once."""
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if a.ndim == 1 and a.size > 1 and np.allclose(a[1:], b[:-1], rtol=1e-12, atol=0.0):
            sf = self.sf(np.append(a, b[-1]))
            return np.maximum(sf[:-1] - sf[1:], 0.0)
        return np.maximum(self.sf(a) - self.sf(b), 0.0)

    def mean(self) -> float:
        """E[Y | Y finite], by Simpson's rule per component in the Gaussian's own coordinate (smooth there), up to
        the output at which the loss reaches the cap; prv-accountant shifts the discretisation to this mean."""
        q, s = self.q, self.sigmas[:, None]
        x_cap = s**2 * loss_threshold(q, np.array([self.loss_cap])) + 0.5
        total = (1 - q) * self.revealed_mass * self.floor if q < 1.0 else 0.0  # the revealed tail's atom
        for mass, centre in ((q, 1.0), (1.0 - q, 0.0)):
            if mass > 0.0:
                upper = np.clip((x_cap - centre) / s, -WINDOW, WINDOW)
                u = -WINDOW + (upper + WINDOW) * np.linspace(0.0, 1.0, MEAN_POINTS + 1)
                loss = _loss(q, centre + s * u, s)
                simpson = integrate.simpson(loss * stats.norm.pdf(u), x=u, axis=1)
                total += mass * float(self.weights @ simpson)
        return total / (1.0 - self.pm_inf)

    @cached_property
    def _mgf_cells(self) -> tuple[np.ndarray, np.ndarray]:
        """(upper edge, mass) of cells covering the finite support [log(1 - q), cap]."""
        pieces, start = [], max(self.floor, MGF_FLOOR)  # the first cell takes every loss below its edge
        for stop, points in MGF_GRID:
            stop = min(stop, self.loss_cap)
            if stop > start:
                pieces.append(np.linspace(start, stop, points))
                start = stop
        edges = np.unique(np.concatenate(pieces)) if pieces else np.array([start])
        sf = self.sf(edges)
        masses = np.concatenate([[1.0 - sf[0]], -np.diff(sf)])
        return edges, np.maximum(masses, 0.0)

    def rdp(self, alpha: float) -> float:
        """An upper bound on log E[exp((alpha - 1) Y) | Y finite] / (alpha - 1), what the RDP-to-(eps, delta)
        conversion and the discretisation's domain need; finite at every order. The smaller of two bounds:
        - each cell's mass at its upper edge: tight in heavy tails, but the cells near 0 over-state a step by about
          their width, which many steps multiply;
        - the uncapped moments at the integer order n = ceil(alpha) (the closed binomial sums of Mironov, Talwar and
          Zhang 2019 for each component; E[e^(lam Y)]^(1/lam) never decreases in lam): exact at integer orders,
          useless in heavy tails."""
        if alpha not in self._rdp_cache:
            self.prefill_rdp([alpha])
        return self._rdp_cache[alpha]

    def prefill_rdp(self, alphas: Sequence[float]) -> None:
        """`rdp` at many orders in one pass (an RDP accountant then asks for each in turn: one order at a time cost
        a D2P2 calibration 17 of its 21 seconds)."""
        missing = np.array(sorted({float(alpha) for alpha in alphas} - set(self._rdp_cache)))
        if not missing.size:
            return
        upper, masses = self._mgf_cells
        lam = missing - 1.0
        cells = log_sum_exp(lam[:, None] * upper[None, :], axis=1, weights=masses[None, :]) / lam
        orders = np.ceil(missing - 1e-12).astype(np.int64)
        unique = np.unique(orders)
        integer = dict(zip(unique.tolist(), self._integer_order_bounds(unique), strict=True))
        bounds = np.minimum(cells, [integer[order] for order in orders.tolist()])
        self._rdp_cache.update(zip(missing.tolist(), bounds.tolist(), strict=True))

    def _integer_order_bounds(self, orders: np.ndarray) -> np.ndarray:
        """log(sum_k w_k A_n(s_k) + revealed atom) - log(1 - pm_inf), over n - 1, at each integer order n, with A_n(s)
        the subsampled Gaussian's moment (unsampled: E_Q[(P/Q)^j] = exp(j (j - 1) / (2 s^2))): the finite part's
        moment is at most the whole."""
        with np.errstate(divide="ignore"):
            log_weights = np.log(self.weights)
        total = (log_mixture_moments(self.q, self.sigmas, log_weights, orders) if self.weights.size
                 else np.full(orders.size, -np.inf))
        atom = (1 - self.q) * self.revealed_mass
        if atom > 0.0:
            total = np.logaddexp(total, math.log(atom) + (orders - 1) * self.floor)
        return (total - math.log1p(-self.pm_inf)) / (orders - 1)


def log_mixture_moments(q: float, sigmas: np.ndarray, log_weights: np.ndarray, orders: np.ndarray,
                        stop_rdp: float = math.inf) -> np.ndarray:
    """log sum_k w_k A_n(s_k) at each integer order n >= 2 (ascending), A_n the Poisson-subsampled Gaussian's
    moment at noise multiplier s_k; ORDER_CHUNK orders per array. Once a chunk's last order's RDP (the log moment
    over n - 1) passes `stop_rdp`, the larger orders are left at +inf (RDP never decreases with the order)."""
    orders = np.asarray(orders, dtype=np.int64)
    out = np.full(orders.size, np.inf)
    for start in range(0, orders.size, ORDER_CHUNK):
        chunk = orders[start:start + ORDER_CHUNK]
        j = np.arange(chunk.max() + 1)
        moments = log_subsampled_moments(q, chunk, j * (j - 1) / (2 * sigmas[:, None] ** 2))
        out[start:start + chunk.size] = log_sum_exp(moments + log_weights[:, None], axis=0)
        if out[start + chunk.size - 1] / (chunk[-1] - 1) > stop_rdp:
            break
    return out


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

    def effective_sigma(self, tail_probability: np.ndarray) -> np.ndarray:
        """Effective noise multiplier at the given probability from the dangerous tail of chi2_df / df (the special
        functions behind scipy.stats.chi2's ppf and isf: freezing the law cost a D2P2 calibration 2 of its 20 s)."""
        tail_probability = np.asarray(tail_probability, dtype=np.float64)
        if self.exponent > 0:  # small chi-square -> small effective noise
            scale = 2 * special.gammaincinv(self.df / 2, tail_probability) / self.df
        else:  # large chi-square -> small effective noise
            scale = special.chdtri(self.df, tail_probability) / self.df
        return self.noise_multiplier * scale ** (self.exponent / 2)

    def tail_probability(self, effective_sigma: np.ndarray | float) -> np.ndarray:
        """Probability that the effective noise multiplier is below the given value (inverse of effective_sigma)."""
        ratio = (np.asarray(effective_sigma) / self.noise_multiplier) ** (2 / self.exponent) * self.df
        return special.chdtr(self.df, ratio) if self.exponent > 0 else special.chdtrc(self.df, ratio)

    def components(self, revealed_mass: float) -> tuple[np.ndarray, np.ndarray]:
        """(effective sigmas, weights) of the bins above the revealed tail, each bin at its dangerous edge.

        Tail bins step the effective sigma by SIGMA_RATIO (losses scale as 1 / sigma^2, so this bounds each bin's
        over-statement) and the probability by at most GEOMETRIC_RATIO; the bulk is cut uniformly in probability."""
        eta = revealed_mass
        end = max(eta, GEOMETRIC_END)
        sigmas = _geometric(float(self.effective_sigma(eta)), float(self.effective_sigma(end)), SIGMA_RATIO)
        tail = _refine_ratio(np.unique(np.concatenate([[eta], self.tail_probability(sigmas), [end]])), GEOMETRIC_RATIO)
        edges = np.unique(np.concatenate([tail[(tail >= eta) & (tail <= end)], np.linspace(end, 1.0, BULK_BINS + 1)]))
        return self.effective_sigma(edges[:-1]), np.diff(edges)

    def revealed_mass(self, inf_budget: float) -> float:
        """Tail mass treated as revealing the sample: what REVEALED_BELOW_SIGMA forces, else a sliver of the +inf
        budget."""
        forced = float(self.tail_probability(REVEALED_BELOW_SIGMA))
        return min(1.0, max(MIN_TAIL_MASS, forced, REVEALED_SHARE * inf_budget / max(self.sampling_rate, 1e-300)))

    def truncated_rdp(self, orders: np.ndarray, tail_mass: float) -> np.ndarray:
        """Renyi DP at integer orders of the step whose scale law is conditioned on leaving out its dangerous tail
        of mass `tail_mass`: log sum_k w_k A_n(s_k) / (n - 1), A_n(s) the subsampled Gaussian's moment (Mironov,
        Talwar and Zhang 2019), over the bins of `components` renormalised to the conditioned law. With the scale
        revealed this bounds the mixture's moment from above, each bin at its dangerous edge bounding the bin; A_n
        bounds the other direction's moment too, so it holds under add and remove. Without the cut JL's moments are
        infinite at every order (chi2_r near 0 makes the noise vanish); the cut-off tail is paid for in delta by
        whoever conditions on it (dpbench.privacy.tuning). Orders past the first whose RDP exceeds USELESS_RDP
        come back as +inf."""
        if not 0.0 < tail_mass < 1.0:
            raise ValueError(f"the left-out tail mass must lie in (0, 1), got {tail_mass}")
        orders = np.asarray(orders, dtype=np.int64)
        if np.any(orders < 2) or np.any(np.diff(orders) <= 0):
            raise ValueError(f"the orders must be increasing integers >= 2 (past USELESS_RDP the computation ends), "
                             f"got {orders.tolist()}")
        sigmas, weights = self.components(tail_mass)
        moments = log_mixture_moments(self.sampling_rate, sigmas, np.log(weights / weights.sum()), orders, USELESS_RDP)
        return moments / (orders - 1)

    def accounting_prv(self, inf_budget: float) -> SubsampledGaussianMixturePRV:
        """The mixture capped at the smallest loss whose mass above (plus the revealed tail) fits in inf_budget."""
        return _capped_prv(self, float(inf_budget))

    def prv(self) -> PrivacyRandomVariable:
        """The mixture kept up to MAX_LOSS_CAP (no +inf budget to spend)."""
        return self.accounting_prv(0.0)


@lru_cache(maxsize=64)
def _capped_prv(mechanism: SubsampledGaussianMixture, inf_budget: float) -> SubsampledGaussianMixturePRV:
    eta = mechanism.revealed_mass(inf_budget)
    sigmas, weights = mechanism.components(eta)
    return capped_prv(mechanism.sampling_rate, sigmas, weights, eta, inf_budget)


@lru_cache(maxsize=64)
def capped_subsampled_gaussian(sampling_rate: float, sigma: float, inf_budget: float) -> SubsampledGaussianMixturePRV:
    """The plain Poisson-subsampled Gaussian as a one-component capped mixture: the same law below the cap, and a
    mean computed per component (prv-accountant's quadrature of a truncated PRV's mean fails at small sigma and
    large q, which used to force the looser RDP fallback)."""
    return capped_prv(sampling_rate, np.array([sigma]), np.array([1.0]), 0.0, inf_budget)


def capped_prv(q: float, sigmas: np.ndarray, weights: np.ndarray, eta: float,
               inf_budget: float) -> SubsampledGaussianMixturePRV:
    """The mixture capped at the smallest loss whose mass above (plus the revealed tail eta) fits in inf_budget."""
    def excess(log_cap: float) -> float:
        above = mixture_sf(q, sigmas, weights, np.array([math.exp(log_cap)]))[0]
        return math.log(max(q * eta + above, 1e-300)) - math.log(inf_budget)

    low, high = math.log(MIN_CAP), math.log(MAX_LOSS_CAP)
    if inf_budget <= 0.0 or excess(high) >= 0.0:
        cap = MAX_LOSS_CAP
    elif excess(low) <= 0.0:
        cap = MIN_CAP
    else:
        cap = math.exp(min(high, optimize.brentq(excess, low, high, xtol=1e-3) + 1e-3))  # the root's upper side
    return SubsampledGaussianMixturePRV(q, sigmas, weights, eta, cap)
