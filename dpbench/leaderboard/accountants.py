"""A published anchor's runs accounted twice: dpbench's PRV accountant (the epsilon each cell spent) beside Google
dp-accounting's PLD and RDP accountants on the same Poisson-subsampled Gaussian steps.

A paper states its epsilon by its own accountant (Tramer & Boneh: RDP), so a run at the paper's own noise multiplier
is read against the paper's figure only with every accountant's epsilon for that noise in view.
"""

from __future__ import annotations

from typing import Any

from dpbench.leaderboard.cells import Outcome
from dpbench.leaderboard.suite import Task

GAUSSIAN_STEPS = ("vanilla",)
"""Privatizers whose every step is one Poisson-subsampled Gaussian, the event dp-accounting expresses exactly."""


def dp_accounting_epsilons(sampling_rate: float, noise_multiplier: float, steps: int, delta: float) \
        -> tuple[float, float]:
    """(PLD, RDP) epsilon at `delta` of `steps` Poisson-subsampled Gaussian steps, from dp-accounting."""
    from dp_accounting import dp_event, pld, rdp

    event = dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(sampling_rate, dp_event.GaussianDpEvent(noise_multiplier)), steps)
    return (pld.PLDAccountant().compose(event).get_epsilon(delta),
            rdp.RdpAccountant().compose(event).get_epsilon(delta))


def _accountable(results: dict[str, Any] | None) -> bool:
    return bool(results and results.get("private") and results.get("privatizer") in GAUSSIAN_STEPS
                and results.get("sampling") == "poisson" and results.get("noise_multiplier"))


def accountant_lines(task: Task, outcomes: list[Outcome]) -> list[str]:
    """One line per distinct (method, noise, sampling rate, steps) among the task's test cells, when the task
    reproduces a published figure: its epsilon by dpbench's accountant and by dp-accounting's two."""
    if not task.anchors:
        return []
    runs: dict[tuple, float] = {}
    for outcome in outcomes:
        results = outcome.results
        if outcome.cell.get("task") != task.name or outcome.cell.get("phase") != "test" or not _accountable(results):
            continue
        label = outcome.cell.get("label") or outcome.cell.get("method")
        key = (label, float(results["noise_multiplier"]), float(results["sampling_rate"]), int(results["steps"]),
               float(results["delta"]))
        runs[key] = float(results["epsilon"])
    lines = []
    for (label, sigma, rate, steps, delta), spent in sorted(runs.items()):
        pld_epsilon, rdp_epsilon = dp_accounting_epsilons(rate, sigma, steps, delta)
        lines.append(f"- {label} at noise multiplier {sigma:.3g} (sampling rate {rate:.4g}, {steps:,} steps, delta "
                     f"{delta:g}): epsilon {spent:.3f} by dpbench's PRV accountant, {pld_epsilon:.3f} by "
                     f"dp-accounting's PLD, {rdp_epsilon:.3f} by its RDP accountant")
    return ["Epsilon of these runs by each accountant:", "", *lines, ""] if lines else []
