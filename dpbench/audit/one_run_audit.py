"""A one-run privacy audit (Steinke, Nasr & Jagielski 2023) of a real multi-epoch DP training run: canaries in, lower
bounds on epsilon out. `python -m dpbench.audit.one_run` (one_run.py) runs it; the method is described there."""

from __future__ import annotations

import dataclasses
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor

from dpbench.audit.canary_run import CanaryRun, train
from dpbench.audit.one_run_attacks import honest_score, replay_score, shadow_score, step_evidence
from dpbench.audit.one_run_bound import epsilon_lower_bound

GUESSED_FRACTION = {"shadow": 0.25, "replay": 0.1, "honest": 0.1}
"""Fixed before looking at any run: each attacker guesses "member" for this fraction of the canaries, its top
scores (a member is sampled at all with probability about 1 - e^-1 when epochs replay, so the replay attacker
guesses fewer)."""


@dataclass(frozen=True)
class AttackBound:
    attack: str
    guesses: int
    correct: int
    epsilon_lower_bound: float


@dataclass(frozen=True)
class OneRunAudit:
    claimed_epsilon: float
    delta: float
    confidence: float
    canaries: int
    members: int
    steps: int
    epochs: int
    noise_multiplier: float
    attacks: tuple[AttackBound, ...]
    seconds: float

    @property
    def epsilon_lower_bound(self) -> float:
        return max(a.epsilon_lower_bound for a in self.attacks)

    @property
    def consistent(self) -> bool:
        """No attacker beat the claim: what an honest run shows (at the stated confidence)."""
        return self.epsilon_lower_bound <= self.claimed_epsilon

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "epsilon_lower_bound": self.epsilon_lower_bound,
                "consistent": self.consistent}


def _shadow_config(published: dict) -> DictConfig:
    """The published config; a value the run withheld (a redacted string where a seed goes) is the OS's to draw."""
    cfg = OmegaConf.create(published["config"])
    if isinstance(OmegaConf.select(cfg, "privacy.seed"), str):
        cfg.privacy.seed = None
    return cfg


def attacker_scores(run: CanaryRun, shadow_dir: Path) -> dict[str, Tensor]:
    """Every attacker's scores, from the iterates and results.json alone (the members are never passed here)."""
    evidence = step_evidence(run.iterates, run.published)
    nulls = torch.zeros(run.iterates.shape[-1], dtype=torch.bool)
    shadow = train(_shadow_config(run.published), shadow_dir, nulls)
    return {
        "shadow": shadow_score(evidence, step_evidence(shadow.iterates, shadow.published)),
        "replay": replay_score(evidence, run.published),
        "honest": honest_score(evidence, run.published),
    }


def _bound(attack: str, scores: Tensor, members: Tensor, delta: float, beta: float) -> AttackBound:
    guesses = max(1, int(GUESSED_FRACTION[attack] * len(scores)))
    top = torch.argsort(scores, descending=True, stable=True)[:guesses]
    correct = int(members[top].sum())
    return AttackBound(attack, guesses, correct, epsilon_lower_bound(len(scores), guesses, correct, delta, beta))


def one_run_audit(
    cfg: DictConfig, work_dir: Path, membership_seed: int | None = None, confidence: float = 0.95
) -> OneRunAudit:
    """Train `cfg` (an audit_config) once with random members, attack it, and bound its epsilon from below.

    membership_seed makes the members reproducible (tests); by default they come from the OS.
    """
    started = time.perf_counter()
    canaries = int(cfg.data.canaries)
    seed = secrets.randbits(63) if membership_seed is None else membership_seed
    members = torch.rand(canaries, generator=torch.Generator().manual_seed(seed)) < 0.5
    run = train(cfg, Path(work_dir) / "run", members)
    scores = attacker_scores(run, Path(work_dir) / "shadow")
    published = run.published
    beta = (1.0 - confidence) / len(scores)
    bounds = tuple(_bound(name, s, members, published["delta"], beta) for name, s in scores.items())
    return OneRunAudit(
        published["epsilon"], published["delta"], confidence, canaries, int(members.sum()), published["steps"],
        published["epochs"], published["noise_multiplier"], bounds, time.perf_counter() - started,
    )
