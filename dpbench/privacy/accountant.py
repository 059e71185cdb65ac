"""Epsilon for a composition of mechanisms: prv-accountant first, its RDP accountant as the fallback.

The reported epsilon is prv-accountant's *upper* bound, so the figure never under-reports; the estimate is kept
beside it. When the PRV computation fails (overflow at small noise, a non-finite result, or a time-out), the RDP
bound over the same privacy random variables is used and the method is recorded.
"""

from __future__ import annotations

import math
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass

import numpy as np
from prv_accountant.composers import Heterogeneous
from prv_accountant.discrete_privacy_random_variable import DiscretePrivacyRandomVariable
from prv_accountant.discretisers import CellCentred
from prv_accountant.domain import Domain
from prv_accountant.other_accountants import RDP
from prv_accountant.privacy_random_variables import PrivacyRandomVariable, PrivacyRandomVariableTruncated

from dpbench.privacy.mechanisms import Composition, Mechanism


@dataclass(frozen=True)
class EpsilonReport:
    epsilon: float
    """Upper bound on epsilon: the figure dpbench reports."""
    epsilon_estimate: float
    method: str
    """'prv', 'rdp' (fallback) or 'none' (nothing private was composed)."""
    fallback_reason: str | None = None
    epsilon_lower: float | None = None
    """Lower bound on the true epsilon (PRV: the discretisation's error bar below the estimate; None for RDP, which
    bounds from above only): a figure below it certainly under-reports this composition."""

    def to_dict(self) -> dict:
        return asdict(self)


def merge_composition(composition: Composition) -> Composition:
    """Sum the counts of identical mechanisms and drop steps that reveal nothing."""
    counts: Counter[Mechanism] = Counter()
    for mechanism, steps in composition:
        if steps < 0:
            raise ValueError(f"a mechanism cannot be applied a negative number of times ({steps})")
        if steps and not mechanism.is_trivial:
            counts[mechanism] += steps
    return list(counts.items())


MAX_DOMAIN = 200.0
"""Largest privacy-loss domain [-L, L] the PRV discretisation may use (memory grows with L / mesh) ..."""
MAX_DOMAIN_PER_CAP = 3.0
"""... or this many times the largest loss cap, whose PRVs need the domain to reach the cap ..."""
MAX_GRID_POINTS = 4_000_000
"""... or as wide as this many grid points allow at the run's mesh (coarse eps_error, e.g. 0.1 at epsilon 30) ..."""
MAX_DOMAIN_ANY = 10_000.0 if np.finfo(np.longdouble).maxexp > 1024 else 700.0
"""... but never more: prv-accountant evaluates exp(t) over the domain in long double (overflow past ~11,356 on
x86; where long double is a double, past ~709)."""
INF_SHARE = 0.01
"""Share of delta that all steps together may spend as +inf mass from loss caps (Mechanism.accounting_prv)."""
RELATIVE_EPS_ERROR = 5e-4
"""Epsilon error per unit of the largest loss cap: epsilons of the order of a large cap need no finer mesh."""
SMALL_ORDERS = (1.001, 1.002, 1.005, 1.01, 1.02, 1.05)
"""Renyi orders near 1 for the domain bound: capped heavy tails have huge moments at prv-accountant's orders."""
DEFAULT_ORDERS = tuple([1.0 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))
"""prv-accountant's own orders."""


def accounting_prvs(composition: Composition, delta: float) -> list[PrivacyRandomVariable]:
    """Each mechanism's PRV given its share of the +inf budget (INF_SHARE * delta spread over every step)."""
    budget = INF_SHARE * delta / sum(count for _, count in composition)
    return [mechanism.accounting_prv(budget) for mechanism, _ in composition]


def infinite_mass(prvs: list[PrivacyRandomVariable], counts: list[int]) -> float:
    """Probability that some step's privacy loss is +inf (revealed samples, capped losses)."""
    log_keep = sum(count * math.log1p(-prv.pm_inf) for prv, count in zip(prvs, counts, strict=True))
    return -math.expm1(log_keep)


def rdp_accountant(prvs: list[PrivacyRandomVariable], orders: tuple[float, ...]) -> RDP:
    """prv-accountant's RDP accountant over `orders`, each mixture's curve first computed in one pass (the
    accountant asks for one order at a time)."""
    for prv in prvs:
        prefill = getattr(prv, "prefill_rdp", None)
        if prefill is not None:
            prefill(orders)
    return RDP(prvs=prvs, orders=list(orders))


def loss_cap(prvs: list[PrivacyRandomVariable]) -> float:
    """Largest loss cap among the PRVs (0 when none is capped)."""
    return max((getattr(prv, "loss_cap", 0.0) for prv in prvs), default=0.0)


def safe_domain(prvs: list[PrivacyRandomVariable], counts: list[int], eps_error: float, delta_error: float) -> float:
    """prv-accountant's safe domain (Gopi et al. 2021, Remark 5.6: RDP tail bounds of the composition at
    delta_error/4 and of each PRV at delta_error/(8 * steps), plus 3), with two changes for capped PRVs: their finite
    losses end at the cap, which bounds their own tail exactly, and orders near 1 bound the composition's tail."""
    composed = rdp_accountant(prvs, (*SMALL_ORDERS, *DEFAULT_ORDERS))
    bound = composed.compute_epsilon(delta=delta_error / 4, num_self_compositions=counts)[2]
    for prv in prvs:
        single = rdp_accountant([prv], DEFAULT_ORDERS).compute_epsilon(delta=delta_error / 8 / sum(counts),
                                                                       num_self_compositions=[1])[2]
        bound = max(bound, min(single, getattr(prv, "loss_cap", math.inf)))
    return max(bound, eps_error) + 3


def discretise(prv: PrivacyRandomVariable, grid: Domain) -> DiscretePrivacyRandomVariable:
    """prv-accountant's mean-preserving cell-centred discretisation. A PRV whose finite losses lie inside the grid
    and that computes its own mean (capped mixtures) is used as it is; others are truncated to the grid by
    prv-accountant's wrapper, whose mean is an adaptive quadrature (unreliable on long heavy tails)."""
    low, high = getattr(prv, "floor", -math.inf), getattr(prv, "loss_cap", math.inf)
    inside = grid.t_min() <= low and high <= grid.t_max()
    return CellCentred().discretise(prv if inside else PrivacyRandomVariableTruncated(prv, grid.t_min(), grid.t_max()),
                                    grid)


class PrivacyAccountant:
    """Composes heterogeneous mechanisms with the PRV accountant (Gopi, Lee, Wutschitz 2021)."""

    def __init__(self, eps_error: float = 0.01, delta_error_ratio: float = 1e-3, timeout_s: float = 120.0):
        self.eps_error = eps_error
        self.delta_error_ratio = delta_error_ratio
        self.timeout_s = timeout_s

    def epsilon(self, composition: Composition, delta: float) -> EpsilonReport:
        if not 0.0 < delta < 1.0:
            raise ValueError(f"delta must lie in (0, 1), got {delta}")
        merged = merge_composition(composition)
        if not merged:
            return EpsilonReport(0.0, 0.0, "none", epsilon_lower=0.0)
        prvs, counts = accounting_prvs(merged, delta), [count for _, count in merged]
        if infinite_mass(prvs, counts) >= delta:
            return EpsilonReport(math.inf, math.inf, "prv", "probability of an infinite privacy loss exceeds delta",
                                 math.inf)
        with ThreadPoolExecutor(max_workers=1) as pool:
            future = pool.submit(self._prv_epsilon, prvs, counts, delta)
            try:
                upper, estimate, lower = future.result(timeout=self.timeout_s)
                reason = None if math.isfinite(upper) and upper >= 0 else f"non-finite PRV result {upper}"
            except FutureTimeout:
                reason = f"PRV accountant exceeded {self.timeout_s:.0f} s"
                pool.shutdown(wait=False, cancel_futures=True)
            except (ValueError, RuntimeError, FloatingPointError, OverflowError, ArithmeticError, MemoryError) as error:
                reason = f"PRV accountant failed: {error!r}"
        if reason is None:
            return EpsilonReport(upper, estimate, "prv", epsilon_lower=lower)
        rdp_epsilon = self.rdp_epsilon(merged, delta)
        return EpsilonReport(rdp_epsilon, rdp_epsilon, "rdp", reason)

    def _prv_epsilon(
        self, prvs: list[PrivacyRandomVariable], steps: list[int], delta: float
    ) -> tuple[float, float, float]:
        """(upper bound, estimate, lower bound) of epsilon."""
        delta_error = delta * self.delta_error_ratio
        cap = loss_cap(prvs)
        eps_error = max(self.eps_error, RELATIVE_EPS_ERROR * cap)
        domain = safe_domain(prvs, steps, eps_error=eps_error, delta_error=delta_error)
        # prv-accountant's PRVAccountant, step by step (Gopi et al. 2021, Theorem 5.5's mesh), but see `discretise`
        mesh = eps_error / np.sqrt(sum(steps) / 2 * np.log(12 / delta_error))
        limit = min(MAX_DOMAIN_ANY, max(MAX_DOMAIN, MAX_DOMAIN_PER_CAP * cap, MAX_GRID_POINTS * mesh / 2))
        if domain > limit:
            raise ValueError(f"the PRV domain would span +-{domain:.3g} (limit {limit:g})")
        grid = Domain.create_aligned(-domain, domain, mesh)
        composed = Heterogeneous([discretise(prv, grid) for prv in prvs]).compute_composition(steps)
        lower, estimate, upper = composed.compute_epsilon(delta, delta_error, eps_error)
        return float(upper), float(estimate), float(lower)

    @staticmethod
    def rdp_epsilon(composition: Composition, delta: float) -> float:
        """Renyi-DP bound over the same PRVs: looser, but robust where the PRV discretisation is not.

        Mass at +inf (pm_inf) is outside RDP: it is paid from delta first.
        """
        merged = merge_composition(composition)
        if not merged:
            return 0.0
        prvs, counts = accounting_prvs(merged, delta), [count for _, count in merged]
        remaining = delta - infinite_mass(prvs, counts)
        if remaining <= 0:
            return math.inf
        rdp = rdp_accountant(prvs, (*SMALL_ORDERS, *DEFAULT_ORDERS))
        _, _, epsilon = rdp.compute_epsilon(delta=remaining, num_self_compositions=counts)
        return float(epsilon)
