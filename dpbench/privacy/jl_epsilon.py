"""Bu et al. 2021, Figure 3's data: epsilon of DP-SGD-JL against the JL dimension r (and epochs), beside vanilla
DP-SGD, from the accountant the runs use (the chi-square mixture of Theorem 2.3 for JL). `python -m dpbench.jl_curve`
prints and plots it."""

from __future__ import annotations

from dpbench.privacy.accountant import PrivacyAccountant
from dpbench.privacy.mechanisms import SubsampledGaussian
from dpbench.privacy.mixture import SubsampledGaussianMixture

VANILLA = "vanilla"


def epsilon_table(sigma: float, sampling_rate: float, steps_per_epoch: int, delta: float, projections: list[int],
                  points: list[int]) -> dict[str, dict[int, float]]:
    """{r or 'vanilla': {epoch: epsilon}}; inf where the accountant can bound nothing."""
    accountant = PrivacyAccountant()
    table: dict[str, dict[int, float]] = {}
    for r in [*projections, VANILLA]:
        mechanism = (SubsampledGaussian(sampling_rate, sigma) if r == VANILLA
                     else SubsampledGaussianMixture(sampling_rate, sigma, int(r), 1.0))
        table[str(r)] = {epoch: accountant.epsilon([(mechanism, epoch * steps_per_epoch)], delta).epsilon
                         for epoch in points}
        print(f"  r={r}: " + ", ".join(f"epoch {e}: {v:.3g}" for e, v in table[str(r)].items()), flush=True)
    return table
