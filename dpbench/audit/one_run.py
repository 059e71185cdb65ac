"""`python -m dpbench.audit.one_run [key=value ...]`: a one-run privacy audit of a real multi-epoch DP training run.

Steinke, Nasr & Jagielski (2023): m white-box gradient canaries (dpbench.audit.canary_run), each a member with
probability 1/2, go through one real run (run_experiment: Hydra config, Poisson sampler, strategy, accountant).
The attacker sees every iterate and everything the run publishes (results.json with its config and seed, and the
dpbench source), never the members. Each attacker scores the canaries and guesses its top-scored fraction to be
members; the number of right guesses bounds epsilon from below (dpbench.audit.one_run_bound), with the confidence
split evenly over the attackers (Bonferroni), and the largest bound is compared with the run's own epsilon:
- shadow: re-runs the published config with null canaries only and subtracts; exact when the noise or the batches
  derive from anything published (catches privacy randomness seeded from the public seed);
- replay: adds up the evidence of the same place in every epoch (catches epochs that repeat their batches);
- honest: the per-step likelihood ratio of the subsampled Gaussian the accountant assumes (the baseline).
An honest run stays below its claim (at the stated confidence); a bound above the claim is a privacy bug.
"""

from __future__ import annotations

import argparse
import dataclasses
import secrets
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor

from dpbench.audit.canary_run import CanaryRun, audit_config, train
from dpbench.audit.one_run_attacks import honest_score, replay_score, shadow_score, step_evidence
from dpbench.audit.one_run_bound import epsilon_lower_bound
from dpbench.core.results import write_json_atomic

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


def summary(audit: OneRunAudit) -> str:
    lines = [f"one-run audit: {audit.canaries} canaries ({audit.members} members), {audit.steps} steps over "
             f"{audit.epochs} epochs, sigma {audit.noise_multiplier:.3g}, {audit.seconds:.0f} s"]
    for a in audit.attacks:
        lines.append(f"  {a.attack:<7} {a.correct:>5}/{a.guesses:<5} right  epsilon >= {a.epsilon_lower_bound:.3f}")
    verdict = "consistent" if audit.consistent else "PRIVACY VIOLATION"
    lines.append(f"lower bound {audit.epsilon_lower_bound:.3f} vs claimed {audit.claimed_epsilon:.3f} at delta "
                 f"{audit.delta:g} ({audit.confidence:.0%} confidence): {verdict}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. data.canaries=2000 epochs=30")
    parser.add_argument("--out", type=Path, default=None, help="where the runs and one_run_audit.json go")
    parser.add_argument("--membership-seed", type=int, default=None)
    parser.add_argument("--confidence", type=float, default=0.95)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="one_run_audit_"))
    audit = one_run_audit(audit_config(args.overrides), out, args.membership_seed, args.confidence)
    write_json_atomic(out / "one_run_audit.json", audit.to_json())
    print(summary(audit), f"\nwrote {out / 'one_run_audit.json'}", sep="")
    raise SystemExit(0 if audit.consistent else 1)


if __name__ == "__main__":
    main()
