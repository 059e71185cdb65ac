"""Private tuning's secret draws: the number of trials and each trial's noisy validation score.

Papernot & Steinke's bound holds only if the adversary cannot predict K, and the score's Gaussian noise is what makes
a trial's score private: both come from the run's secret privacy randomness (the `tuning` stream, one key per use),
never from the public seed or the global generators.
"""

from __future__ import annotations

import math

import torch

from dpbench.core.errors import ConfigurationError
from dpbench.privacy.randomness import PrivacyRandomness
from dpbench.privacy.tuning import TrialCount

COUNT, SCORE = 0, 1
"""First index of the `tuning` stream's keys: the number of trials, a trial's score noise."""


def draw_trial_count(randomness: PrivacyRandomness, trials: TrialCount, *indices: int) -> int:
    """K from `trials`' law, from its own key (indices: which tuning, e.g. task and method numbers). The Poisson law
    may give 0: then nothing is selected and nothing released."""
    generator = randomness.numpy_generator("tuning", COUNT, *indices)
    if trials.shape == math.inf:
        return int(generator.poisson(trials.mean))
    gamma = trials.gamma()
    if gamma >= 1.0:
        return 1
    if trials.shape == 0:
        return int(generator.logseries(1.0 - gamma))
    while True:  # the truncated law is the negative binomial given K >= 1
        count = int(generator.negative_binomial(trials.shape, gamma))
        if count > 0:
            return count


def score_sensitivity(examples: int, score_range: float = 1.0) -> float:
    """How much one example moves a mean score over `examples` (accuracy: range 1, so 1/n)."""
    if isinstance(examples, bool) or not isinstance(examples, int) or examples < 1:
        raise ConfigurationError(f"a validation score needs at least one example, got {examples!r}")
    if not (math.isfinite(score_range) and score_range > 0):
        raise ConfigurationError(f"the score's range must be positive and finite (a loss must be clipped to a "
                                 f"bound first), got {score_range!r}")
    return score_range / examples


def noisy_score(randomness: PrivacyRandomness, score: float, examples: int, noise_multiplier: float, trial: int,
                *indices: int, score_range: float = 1.0) -> float:
    """The trial's validation score plus N(0, (noise_multiplier * sensitivity)^2), from the trial's own key: the
    release that `tuning.trial_event` accounts as a Gaussian at this noise multiplier."""
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ConfigurationError(f"the validation score's noise multiplier must be positive and finite, got "
                                 f"{noise_multiplier!r}")
    std = noise_multiplier * score_sensitivity(examples, score_range)
    noise = randomness.draws("tuning", SCORE, trial, *indices).normal((1,), torch.float64)
    return float(score) + std * float(noise[0])
