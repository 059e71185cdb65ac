"""Each method's tuning: learning rate and clip norm searched jointly on a log grid, a fixed number of its points in
a fixed shuffled order (the headline protocol), or, in a per-run profile only, a grid that grows past an edge until
the best point is interior.

A grid rather than a sampler: every method gets exactly the same points, a resumed suite re-derives the same
extensions from the trials it recorded, and "interior" has one meaning (the best value has an explored neighbour on
both sides, on each axis). A non-private method has no clip norm: its learning-rate axis gets as many points as a
private method's whole grid, over the same range, so that its tuning is as fine.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from dpbench.core.errors import ConfigurationError


def _rounded(value: float) -> float:
    return float(f"{value:.3g}")


DEFAULT_SCORE_NOISE = 20.0
"""z = 20: K = 9 noisy scores cost about as much as one more final run at total epsilon 1 (CNN task), and the score's
standard deviation is 20/n (4 points at 500 validation examples: a larger split resolves finer at the same cost). At
larger budgets a smaller z costs little: on the CNN task (9 trials, 5 final runs) z = 10 instead of 20 raises the
training noise 7% at total epsilon 3 (sigma 8.47 vs 7.90), z = 5 6% at epsilon 8 (3.62 vs 3.40)."""
SHUFFLE_SEED = 0
"""The trials' order over the grid: fixed and data-independent (public: the order reveals nothing about the data),
so that the first K points spread over the grid and every method with the same grid gets the same points."""


@dataclass(frozen=True)
class GridSpec:
    """The profile's tuning: points per axis on the task's ranges, and how far past them the grid may grow."""

    lr_points: int
    clip_points: int
    max_growth: float
    """The most a range may grow past each of its ends (a factor): the search's documented limit."""
    each_budget: bool
    """Tune at every budget (else once, at the profile's tune_epsilon, and reuse the choice)."""
    count: int | None = None
    """Trials per method and budget: the first `count` points of the grid in SHUFFLE_SEED's order (None: all)."""
    score_noise: float | dict[float, float] = DEFAULT_SCORE_NOISE
    """Noise multiplier of each trial's released validation score, in units of its sensitivity (total budgets): one
    for every budget, or one per budget (a larger budget affords a finer score at the same share of it)."""

    def __post_init__(self) -> None:
        if self.lr_points < 1 or self.clip_points < 1 or self.max_growth < 1:
            raise ConfigurationError(f"tuning needs lr_points >= 1, clip_points >= 1 and max_growth >= 1, got {self}")
        if self.count is not None and not 1 <= self.count <= self.lr_points * self.clip_points:
            raise ConfigurationError(f"tuning.trials must lie in [1, lr_points x clip_points = "
                                     f"{self.lr_points * self.clip_points}] (each trial a distinct point), got "
                                     f"{self.count}")
        if self.count is not None and self.grows:
            raise ConfigurationError("tuning.trials fixes the number of trials: it takes max_growth: 1 (a grid that "
                                     "grows gives each method as many trials as its scores ask for)")
        noises = self.score_noise.values() if isinstance(self.score_noise, dict) else [self.score_noise]
        if not all(math.isfinite(noise) and noise > 0 for noise in noises):
            raise ConfigurationError(f"tuning.score_noise must be positive and finite, got {self.score_noise!r}")

    def score_noise_at(self, epsilon: float) -> float:
        """The score's noise multiplier at a budget (a per-budget mapping must name every budget it is asked for)."""
        if not isinstance(self.score_noise, dict):
            return self.score_noise
        if epsilon not in self.score_noise:
            raise ConfigurationError(f"tuning.score_noise {self.score_noise} names no noise for budget "
                                     f"{epsilon:g}: add it")
        return self.score_noise[epsilon]

    @property
    def grows(self) -> bool:
        return self.max_growth > 1

    @property
    def trials(self) -> int:
        """Trials per method and budget on the first range (the same for private and non-private methods)."""
        return self.lr_points * self.clip_points if self.count is None else self.count


def trial_points(points: list[tuple[float, float | None]], count: int) -> list[tuple[float, float | None]]:
    """The first `count` of the grid's points in the fixed shuffled order: every method's trials."""
    shuffled = list(points)
    random.Random(SHUFFLE_SEED).shuffle(shuffled)
    return shuffled[:count]


@dataclass
class Axis:
    """Explored values of one hyperparameter, log-spaced by `ratio`; it grows one step at a time past an edge."""

    values: list[float]
    ratio: float
    floor: float
    ceiling: float

    @classmethod
    def over(cls, bounds: tuple[float, float], points: int, max_growth: float) -> Axis:
        low, high = bounds
        if points == 1:
            return cls([_rounded(math.sqrt(low * high))], 1.0, low, high)
        ratio = (high / low) ** (1 / (points - 1))
        values = [_rounded(low * ratio**k) for k in range(points)]
        return cls(values, ratio, low / max_growth, high * max_growth)

    def side(self, best: float) -> int:
        """-1 / +1 when the best value is the lowest / highest explored one (and the axis can move), else 0."""
        if self.ratio == 1.0:
            return 0
        if best == self.values[0]:
            return -1
        return 1 if best == self.values[-1] else 0

    def grow(self, side: int) -> float | None:
        """The next value past that edge, or None when it would leave [floor, ceiling] (the limit)."""
        edge = self.values[0] if side < 0 else self.values[-1]
        value = _rounded(edge * self.ratio**side)
        if value < self.floor * (1 - 1e-9) or value > self.ceiling * (1 + 1e-9):
            return None
        self.values = [value, *self.values] if side < 0 else [*self.values, value]
        return value


@dataclass
class TuningGrid:
    """The points tried so far; `extend` adds the next row or column past the best point's edge."""

    lr: Axis
    clip: Axis | None
    limited: list[str] = field(default_factory=list)
    """Edges where the optimum still lies when the grid may not grow further (reported as the search's limit)."""

    @classmethod
    def start(cls, lr_range: tuple[float, float], clip_range: tuple[float, float] | None, spec: GridSpec) -> TuningGrid:
        if clip_range is None:
            return cls(Axis.over(lr_range, spec.trials, spec.max_growth), None)
        return cls(Axis.over(lr_range, spec.lr_points, spec.max_growth),
                   Axis.over(clip_range, spec.clip_points, spec.max_growth))

    def points(self) -> list[tuple[float, float | None]]:
        """Every (lr, clip) of the grid, in a fixed order (learning rate first)."""
        clips = self.clip.values if self.clip else [None]
        return [(lr, clip) for lr in self.lr.values for clip in clips]

    def extend(self, best: tuple[float, float | None]) -> bool:
        """Grow the grid past each edge the best point lies on; False when it is interior or at the limit."""
        grew = False
        self.limited = []
        for name, axis, value in (("lr", self.lr, best[0]), ("clip", self.clip, best[1])):
            if axis is None or value is None:
                continue
            side = axis.side(value)
            if side == 0:
                continue
            if axis.grow(side) is None:
                self.limited.append(f"{name} at its {'lower' if side < 0 else 'upper'} limit")
            else:
                grew = True
        return grew


Trial = tuple[float, float | None, float | None]
"""(learning rate, clip norm or None, validation value or None when the trial did not finish)."""

TIE_RULE = "the smaller learning rate, then the smaller clip norm"
"""How equal validation values are decided (at a validation split's resolution, trials tie): the gentler update,
so that a tie never picks a step that only happened not to diverge at the one tuning seed."""


def best_trial(trials: list[Trial], maximize: bool) -> Trial | None:
    """The finished trial with the best validation value, ties broken by TIE_RULE; None when none finished."""
    finished = [t for t in trials if t[2] is not None]
    if not finished:
        return None
    sign = 1.0 if maximize else -1.0
    return min(finished, key=lambda t: (-sign * t[2], t[0], -math.inf if t[1] is None else t[1]))


STEP_BRACKETED = "lr x clip bracketed"
"""An edge optimum of clipped SGD whose lr x clip lies strictly between the trials' smallest and largest: the step's
size, which is all the pair sets while every sample is clipped, scored worse on both sides of it."""


def optimum_status(trials: list[Trial], lr_range: tuple[float, float],
                   clip_range: tuple[float, float] | None, spec: GridSpec, maximize: bool,
                   step_is_product: bool = False) -> str:
    """What a finished search found, from its recorded trials (lr, clip, validation value): "interior on the first
    range", "interior after growing the range" or "on the edge: ..." (the search's limit). With step_is_product
    (private SGD, whose update is lr x clip times the mean clipped direction plus noise of the same scale), an edge
    optimum also says whether lr x clip is bracketed: a search on a grid's edge can still have found the step size."""
    best = best_trial(trials, maximize)
    if best is None:
        return "no trial finished"
    first = TuningGrid.start(lr_range, clip_range, spec)
    grown = any(lr not in first.lr.values or (first.clip and clip not in first.clip.values)
                for lr, clip, _ in trials)
    edges = []
    lrs = sorted({t[0] for t in trials})
    if len(lrs) > 1 and best[0] in (lrs[0], lrs[-1]):
        edges.append("lr")
    clips = sorted({t[1] for t in trials if t[1] is not None})
    if len(clips) > 1 and best[1] in (clips[0], clips[-1]):
        edges.append("clip")
    if edges:
        steps = sorted({lr * clip for lr, clip, _ in trials if clip is not None})
        bracketed = step_is_product and best[1] is not None and steps[0] < best[0] * best[1] < steps[-1]
        return (f"on the edge of the grid ({' and '.join(edges)}) at the search's limit"
                + (f"; {STEP_BRACKETED}" if bracketed else ""))
    return "interior after growing the range" if grown else "interior on the first range"
