"""Empirical lower bound on one privatized step's epsilon, for any privatizer (a distinguishing attack).

The adversary of differential privacy knows every sample but one. We let it: each trial privatizes the same
background batch either alone or with one canary sample, and the attacker scores the update by its projection on
the canary's own gradient direction. With half the trials it picks a threshold; on the other half the false
positive and false negative rates, bounded by Clopper-Pearson at the given confidence, give
    epsilon >= log((1 - delta - FNR_upper) / FPR_upper)   (and the symmetric test),
which no (epsilon, delta)-DP step can exceed except with probability 1 - confidence. The claimed figure it is
compared with is the accountant's epsilon for the same single step with the canary always included (q = 1).
A privatizer that forgets to clip, or adds too little noise, shows a lower bound above its claim.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats
from torch import Tensor, nn
from torch.utils._pytree import tree_map

from dpbench.core.optim import OptimizerConfig
from dpbench.core.tasks import Batch, Task
from dpbench.privacy.accountant import PrivacyAccountant
from dpbench.privatizers.base import PrivatizerStrategy, StepContext
from dpbench.privatizers.per_sample import trainable_parameters


@dataclass(frozen=True)
class AuditResult:
    epsilon_lower_bound: float
    claimed_epsilon: float
    delta: float
    confidence: float
    trials: int
    false_positive_rate: float
    false_negative_rate: float

    @property
    def consistent(self) -> bool:
        """The attack did not beat the claim (what an honest privatizer must show)."""
        return self.epsilon_lower_bound <= self.claimed_epsilon


def _concat(background: Batch, canary: Batch) -> Batch:
    def join(a: Tensor, b: Tensor) -> Tensor:
        return torch.cat([a, b])

    return tree_map(join, background[0], canary[0]), torch.cat([background[1], canary[1]])


def _flat_update(model: nn.Module) -> Tensor:
    return torch.cat([p.grad.flatten() for p in trainable_parameters(model).values()])


def canary_direction(model: nn.Module, task: Task, canary: Batch) -> Tensor:
    """Unit vector along the canary's (unclipped) gradient: where its contribution shows up."""
    model.zero_grad(set_to_none=True)
    task.per_sample_loss(model, canary).sum().backward()
    direction = _flat_update(model).detach().clone()
    model.zero_grad(set_to_none=True)
    return direction / direction.norm()


def _upper(successes: int, trials: int, confidence: float) -> float:
    """One-sided Clopper-Pearson upper bound of a binomial rate."""
    if successes >= trials:
        return 1.0
    return float(stats.beta.ppf(confidence, successes + 1, trials - successes))


def epsilon_lower_bound(
    without: np.ndarray, with_canary: np.ndarray, delta: float, confidence: float
) -> tuple[float, float, float]:
    """(epsilon lower bound, FPR, FNR) from scores; the threshold is chosen on the first half of each array."""
    half0, half1 = len(without) // 2, len(with_canary) // 2
    pick0, test0 = without[:half0], without[half0:]
    pick1, test1 = with_canary[:half1], with_canary[half1:]
    candidates = np.quantile(np.concatenate([pick0, pick1]), np.linspace(0.01, 0.99, 99))

    def bound(threshold: float, data: tuple[np.ndarray, np.ndarray] = (pick0, pick1)) -> tuple[float, float, float]:
        negatives, positives = data
        false_pos = int((negatives > threshold).sum())
        false_neg = int((positives <= threshold).sum())
        fpr_u = _upper(false_pos, len(negatives), confidence)
        fnr_u = _upper(false_neg, len(positives), confidence)
        best = -math.inf
        for a, b in ((fnr_u, fpr_u), (fpr_u, fnr_u)):
            if 1 - delta - a > 0 and b > 0:
                best = max(best, math.log((1 - delta - a) / b))
        return best, false_pos / len(negatives), false_neg / len(positives)

    threshold = max(candidates, key=lambda t: bound(t)[0])
    epsilon, fpr, fnr = bound(threshold, data=(test0, test1))
    return max(0.0, epsilon), fpr, fnr


def audit_step(
    strategy_factory: Callable[[], PrivatizerStrategy],
    model_factory: Callable[[], nn.Module],
    task: Task,
    background: Batch,
    canary: Batch,
    trials: int = 1000,
    delta: float = 1e-5,
    confidence: float = 0.95,
    optimizer_config: OptimizerConfig | None = None,
) -> AuditResult:
    """Run `trials` privatized steps in each world and bound epsilon from below (see the module docstring).

    With `optimizer_config` the attacker sees the parameter change after the strategy's own update (for
    strategies that own the update, e.g. sparse), else the privatized gradient.
    """
    model = model_factory()
    strategy = strategy_factory()
    strategy.prepare(model, 1, delta, None, PrivacyAccountant())  # an audited run is one step long
    strategy.attach(model)
    direction = canary_direction(model, task, canary)
    start = [p.detach().clone() for p in trainable_parameters(model).values()]
    expected = float(background[1].shape[0] + 1)
    scores: dict[bool, list[float]] = {False: [], True: []}
    joined = _concat(background, canary)
    for trial in range(2 * trials):
        include = bool(trial % 2)
        model.zero_grad(set_to_none=True)
        strategy.privatize(model, task, joined if include else background, StepContext(0, expected))
        if optimizer_config is None:
            scores[include].append(float(_flat_update(model) @ direction))
            continue
        # a fresh optimizer each trial: moments carried over would mix earlier trials (of either world) into this one
        strategy.apply_update(strategy.configure_optimizer(model, optimizer_config))
        with torch.no_grad():
            params = list(trainable_parameters(model).values())
            change = torch.cat([(before - p).flatten() for before, p in zip(start, params, strict=True)])
            for before, p in zip(start, params, strict=True):
                p.copy_(before)
        scores[include].append(float(change @ direction))
    epsilon, fpr, fnr = epsilon_lower_bound(np.array(scores[False]), np.array(scores[True]), delta, confidence)
    one_step = [(dataclasses.replace(m, sampling_rate=1.0), 1) for m in strategy.step_mechanisms(0)]
    claimed = PrivacyAccountant().epsilon(one_step, delta).epsilon
    return AuditResult(epsilon, claimed, delta, confidence, trials, fpr, fnr)
