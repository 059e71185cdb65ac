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
import tempfile
from pathlib import Path

from dpbench.audit.canary_run import audit_config
from dpbench.audit.one_run_audit import OneRunAudit, one_run_audit
from dpbench.core.results import write_json_atomic


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
