"""Per-step mechanisms that strategies report to the accountant.

A mechanism is a small frozen description (hashable, so a ledger can merge repeats and a checkpoint can store it)
that knows how to build its privacy random variable for prv-accountant.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import Any

from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism, PrivacyRandomVariable

Composition = list[tuple["Mechanism", int]]
"""A run's privacy cost: each mechanism with the number of steps it is applied."""


class Mechanism(ABC):
    """One step's privacy mechanism."""

    kind: str

    @abstractmethod
    def prv(self) -> PrivacyRandomVariable:
        """The privacy random variable of one application."""

    def accounting_prv(self, inf_budget: float) -> PrivacyRandomVariable:
        """The PRV to compose when one application may put up to `inf_budget` of its mass at +inf.

        The accountant grants the budget (a share of delta over the run's steps) before building PRVs; a mechanism
        with heavy-tailed losses may move its largest losses to +inf (a dominating PRV) to keep the rest finite.
        """
        return self.prv()

    @property
    def is_trivial(self) -> bool:
        """True when the step reveals nothing (q = 0)."""
        return False

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}  # type: ignore[call-overload]


@dataclass(frozen=True)
class SubsampledGaussian(Mechanism):
    """Gaussian noise sigma*C on a sum of contributions clipped to C, with Poisson sampling at rate q."""

    sampling_rate: float
    noise_multiplier: float
    kind = "subsampled_gaussian"

    def __post_init__(self) -> None:
        if not 0.0 <= self.sampling_rate <= 1.0:
            raise ValueError(f"sampling rate must lie in [0, 1], got {self.sampling_rate}")
        if not self.noise_multiplier > 0.0:
            raise ValueError(f"a private step needs a positive noise multiplier, got {self.noise_multiplier}")

    def prv(self) -> PrivacyRandomVariable:
        return PoissonSubsampledGaussianMechanism(
            sampling_probability=self.sampling_rate, noise_multiplier=self.noise_multiplier
        )

    def accounting_prv(self, inf_budget: float) -> PrivacyRandomVariable:
        """With a +inf budget: the one-component capped mixture, whose discretisation prv-accountant accepts where
        its own PRV's mean check fails (small sigma, large q); the law below the cap is the same."""
        if inf_budget <= 0.0:
            return self.prv()
        from dpbench.privacy.mixture import capped_subsampled_gaussian  # mixture.py builds on this module

        return capped_subsampled_gaussian(self.sampling_rate, self.noise_multiplier, inf_budget)

    @property
    def is_trivial(self) -> bool:
        return self.sampling_rate == 0.0


MECHANISM_KINDS: dict[str, type[Mechanism]] = {SubsampledGaussian.kind: SubsampledGaussian}


def register_mechanism(cls: type[Mechanism]) -> type[Mechanism]:
    """Make a mechanism class restorable from checkpoints and ledgers."""
    MECHANISM_KINDS[cls.kind] = cls
    return cls


def mechanism_from_dict(data: dict[str, Any]) -> Mechanism:
    fields = dict(data)
    kind = fields.pop("kind")
    if kind not in MECHANISM_KINDS:
        raise ValueError(f"unknown mechanism kind {kind!r}; known: {sorted(MECHANISM_KINDS)}")
    return MECHANISM_KINDS[kind](**fields)
