"""A whole procedure's total epsilon (K trials, their noisy scores, S final runs) against dp-accounting's own PLD and
RDP accountants called here directly, its calibration to a total, and private tuning's count of final runs."""

import math

import numpy as np
import pytest
from dp_accounting import dp_event, pld, rdp

from dpbench.core.errors import ConfigurationError
from dpbench.privacy.procedure import Procedure, calibrate_procedure, procedure_epsilon
from dpbench.privacy.tuning import ORDERS, TrialCount, subsampled_gaussian_run, tuning_epsilon
from tests.helpers.rdp_reference import sampled_gaussian_rdp

DELTA = 1e-5
TRIAL_Q, TRIAL_STEPS = 100 / 4500, 90  # a trial trains on the training split less the validation split
FINAL_Q, FINAL_STEPS = 100 / 5000, 100
SCORE = 20.0


def procedure_events(sigma: float, procedure: Procedure) -> dp_event.DpEvent:
    """The same procedure as dp-accounting events: K trials' steps, K Gaussian scores, S finals' steps."""
    def steps(q: float, count: int) -> dp_event.DpEvent:
        return dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), count)

    return dp_event.ComposedDpEvent([
        steps(TRIAL_Q, TRIAL_STEPS * procedure.trials),
        dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(procedure.score_noise_multiplier), procedure.trials),
        steps(FINAL_Q, FINAL_STEPS * procedure.finals),
    ])


def pld_epsilon(sigma: float, procedure: Procedure) -> float:
    accountant = pld.PLDAccountant(value_discretization_interval=1e-4)
    return accountant.compose(procedure_events(sigma, procedure)).get_epsilon(DELTA)


def rdp_epsilon(sigma: float, procedure: Procedure) -> float:
    return rdp.RdpAccountant(list(ORDERS)).compose(procedure_events(sigma, procedure)).get_epsilon(DELTA)


def ours(sigma: float, procedure: Procedure) -> float:
    return procedure_epsilon(subsampled_gaussian_run(TRIAL_Q, sigma, TRIAL_STEPS),
                             subsampled_gaussian_run(FINAL_Q, sigma, FINAL_STEPS), procedure, DELTA)


@pytest.mark.parametrize(("sigma", "trials", "finals"), [(1.2, 4, 5), (2.0, 9, 5), (0.9, 1, 1)])
def test_the_total_is_the_composition_of_every_trial_score_and_final_run(sigma, trials, finals):
    procedure = Procedure(trials, finals, SCORE)
    total, exact, loose = ours(sigma, procedure), pld_epsilon(sigma, procedure), rdp_epsilon(sigma, procedure)
    assert exact <= total <= exact * 1.03 + 0.01  # the PRV upper bound: never below PLD, within its error
    assert total <= loose
    fewer = Procedure(trials, 1, SCORE) if finals > 1 else Procedure(0, 1, SCORE)
    assert ours(sigma, fewer) < total  # every release counts


def test_a_calibration_meets_its_total():
    procedure = Procedure(6, 5, SCORE)
    for target in (1.0, 3.0):
        sigma = calibrate_procedure(lambda s: subsampled_gaussian_run(TRIAL_Q, s, TRIAL_STEPS),
                                    lambda s: subsampled_gaussian_run(FINAL_Q, s, FINAL_STEPS), procedure, target,
                                    DELTA)
        assert target * 0.97 <= ours(sigma, procedure) <= target
        assert pld_epsilon(sigma, procedure) <= target  # dp-accounting agrees it stays within the total
        assert ours(sigma * 0.97, procedure) > target  # and it is the smallest such noise, not any large one
        per_run = ours(sigma, Procedure(0, 1, SCORE))
        assert per_run < target / 2  # each run spends a fraction of the total


def test_scores_too_noisy_to_fit_are_unreachable_and_bad_procedures_refused():
    with pytest.raises(ValueError, match="unreachable"):
        calibrate_procedure(lambda s: subsampled_gaussian_run(TRIAL_Q, s, TRIAL_STEPS),
                            lambda s: subsampled_gaussian_run(FINAL_Q, s, FINAL_STEPS), Procedure(9, 5, 2.0), 1.0,
                            DELTA)
    for args, message in [((-1, 5, 1.0), "trials"), ((3, 0, 1.0), "finals"), ((3, 5, 0.0), "noise multiplier")]:
        with pytest.raises(ConfigurationError, match=message):
            Procedure(*args)


def test_private_tuning_composes_every_evaluation_seed_s_final_run():
    """Papernot & Steinke's Theorem 2 (geometric law, eta = 1) by hand, plus S final runs' RDP, converted as
    dp-accounting converts (Canonne, Kamath & Steinke 2020)."""
    orders = np.array(ORDERS, dtype=float)
    sigma, mean, finals = 2.0, 6.0, 5
    trial = TRIAL_STEPS * sampled_gaussian_rdp(TRIAL_Q, sigma, orders) + orders / (2 * SCORE**2)
    final = FINAL_STEPS * sampled_gaussian_rdp(FINAL_Q, sigma, orders)
    gamma = 1 / mean
    second = np.min(2 * (1 - 1 / orders) * trial + 2 * math.log(1 / gamma) / orders)
    selection = trial + second + math.log(mean) / (orders - 1)

    def convert(curve: np.ndarray) -> float:
        return float(np.min(curve + np.log1p(-1 / orders) - np.log(DELTA * orders) / (orders - 1)))

    run = (subsampled_gaussian_run(TRIAL_Q, sigma, TRIAL_STEPS), subsampled_gaussian_run(FINAL_Q, sigma, FINAL_STEPS))
    five = tuning_epsilon(*run, TrialCount(mean, 1.0), DELTA, SCORE, finals=finals)
    one = tuning_epsilon(*run, TrialCount(mean, 1.0), DELTA, SCORE)
    assert five.with_tuning == pytest.approx(convert(selection + finals * final), rel=1e-6)
    assert one.with_tuning == pytest.approx(convert(selection + final), rel=1e-6)
    assert five.per_run == pytest.approx(one.per_run) and five.with_tuning > one.with_tuning and five.finals == 5
    with pytest.raises(ConfigurationError, match="final runs"):
        tuning_epsilon(*run, TrialCount(mean, 1.0), DELTA, SCORE, finals=0)
