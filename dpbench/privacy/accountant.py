"""Epsilon for a composition of mechanisms: prv-accountant first, its RDP accountant as the fallback.

The reported epsilon is prv-accountant's *upper* bound, so the figure never under-reports; the estimate is kept
beside it. When the PRV computation fails (overflow at small noise, a non-finite result, or a time-out), the RDP
bound over the same privacy random variables is used and the method is recorded.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass

from prv_accountant import PRVAccountant
from prv_accountant.accountant import compute_safe_domain_size
from prv_accountant.other_accountants import RDP

from dpbench.privacy.mechanisms import Composition, Mechanism


@dataclass(frozen=True)
class EpsilonReport:
    epsilon: float
    """Upper bound on epsilon: the figure dpbench reports."""
    epsilon_estimate: float
    method: str
    """'prv', 'rdp' (fallback) or 'none' (nothing private was composed)."""
    fallback_reason: str | None = None

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
"""Largest privacy-loss domain [-L, L] the PRV discretisation may use (memory grows with L / mesh)."""


def infinite_mass(composition: Composition) -> float:
    """Probability that some step's privacy loss is +inf (mechanisms that reveal a sample outright)."""
    log_keep = sum(count * math.log1p(-mechanism.prv().pm_inf) for mechanism, count in composition)
    return -math.expm1(log_keep)


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
            return EpsilonReport(0.0, 0.0, "none")
        if infinite_mass(merged) >= delta:
            return EpsilonReport(math.inf, math.inf, "prv", "probability of an infinite privacy loss exceeds delta")
        with ThreadPoolExecutor(max_workers=1) as pool:
            future = pool.submit(self._prv_epsilon, merged, delta)
            try:
                upper, estimate = future.result(timeout=self.timeout_s)
                reason = None if math.isfinite(upper) and upper >= 0 else f"non-finite PRV result {upper}"
            except FutureTimeout:
                reason = f"PRV accountant exceeded {self.timeout_s:.0f} s"
                pool.shutdown(wait=False, cancel_futures=True)
            except (ValueError, RuntimeError, FloatingPointError, OverflowError, ArithmeticError, MemoryError) as error:
                reason = f"PRV accountant failed: {error!r}"
        if reason is None:
            return EpsilonReport(upper, estimate, "prv")
        rdp_epsilon = self.rdp_epsilon(merged, delta)
        return EpsilonReport(rdp_epsilon, rdp_epsilon, "rdp", reason)

    def _prv_epsilon(self, merged: Composition, delta: float) -> tuple[float, float]:
        prvs = [mechanism.prv() for mechanism, _ in merged]
        steps = [count for _, count in merged]
        delta_error = delta * self.delta_error_ratio
        domain = compute_safe_domain_size(prvs, steps, eps_error=self.eps_error, delta_error=delta_error)
        if domain > MAX_DOMAIN:
            raise ValueError(f"the PRV domain would span +-{domain:.3g} (limit {MAX_DOMAIN:g})")
        with warnings.catch_warnings():  # eps_max is prv-accountant's own safe domain, computed above
            warnings.filterwarnings("ignore", "Assuming that true epsilon")
            accountant = PRVAccountant(
                prvs=prvs,
                max_self_compositions=steps,
                eps_error=self.eps_error,
                delta_error=delta_error,
                eps_max=domain,
            )
        _, estimate, upper = accountant.compute_epsilon(delta=delta, num_self_compositions=steps)
        return float(upper), float(estimate)

    @staticmethod
    def rdp_epsilon(composition: Composition, delta: float) -> float:
        """Renyi-DP bound over the same PRVs: looser, but robust where the PRV discretisation is not.

        Mass at +inf (pm_inf) is outside RDP: it is paid from delta first.
        """
        merged = merge_composition(composition)
        if not merged:
            return 0.0
        remaining = delta - infinite_mass(merged)
        if remaining <= 0:
            return math.inf
        rdp = RDP(prvs=[mechanism.prv() for mechanism, _ in merged])
        _, _, epsilon = rdp.compute_epsilon(delta=remaining, num_self_compositions=[n for _, n in merged])
        return float(epsilon)
