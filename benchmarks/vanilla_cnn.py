"""Issue 2 benchmark: the 26K CNN at batch 256, nonprivate vs dpbench vanilla vs Opacus (hooks, functorch, ghost).

Targets: vanilla samples/s >= 0.7x nonprivate and >= 1.3x Opacus's best engine; vanilla peak memory <= Opacus's.
    python -m benchmarks.vanilla_cnn [--rounds 5 --steps 20]
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from omegaconf import OmegaConf

from benchmarks.harness import (
    arguments,
    compare,
    mnist_batches,
    opacus_ghost_step,
    opacus_hooks_step,
    print_checks,
    print_table,
    ratio,
    save,
)
from dpbench.core.tasks import ClassificationTask
from dpbench.models.cnn import TFPrivacyCNN
from dpbench.privatizers import PrivacySettings, make_strategy
from dpbench.privatizers.base import StepContext

CASES = ["nonprivate", "vanilla", "opacus_hooks", "opacus_functorch", "opacus_ghost"]
SIGMA, CLIP, LR = 1.0, 1.0, 0.5


def make_step(case: str, device: torch.device, batch_size: int) -> Callable[[], None]:
    torch.manual_seed(0)
    model = TFPrivacyCNN().to(device)
    next_batch = mnist_batches(batch_size, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    if case in ("nonprivate", "vanilla"):
        task = ClassificationTask()
        strategy = make_strategy(
            OmegaConf.create({"name": case}), PrivacySettings(CLIP, batch_size / 4000, SIGMA)
        )
        strategy.attach(model)

        def step() -> None:
            optimizer.zero_grad(set_to_none=True)
            strategy.privatize(model, task, next_batch(), StepContext(0, batch_size))
            optimizer.step()

        return step
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    if case == "opacus_ghost":
        return opacus_ghost_step(model, optimizer, batch_size, CLIP, SIGMA, next_batch)
    wrapped = GradSampleModule(model, force_functorch=case == "opacus_functorch")
    dp_optimizer = DPOptimizer(optimizer, noise_multiplier=SIGMA, max_grad_norm=CLIP, expected_batch_size=batch_size)

    return opacus_hooks_step(wrapped, dp_optimizer, next_batch)


def main() -> None:
    args = arguments(__doc__)
    batch_size = args.batch_size or 256
    summary = compare("benchmarks.vanilla_cnn", CASES, {}, batch_size, args.rounds, args.steps, args.warmup,
                      args.threads)
    print_table(f"26K CNN, batch {batch_size}", summary, "nonprivate")
    opacus = [c for c in CASES if c.startswith("opacus") and "samples_per_s" in summary.get(c, {})]
    best = max(opacus, key=lambda c: summary[c]["samples_per_s"]) if opacus else None
    checks = {
        "vanilla / nonprivate samples/s (target >= 0.7)": ratio(summary, "vanilla", "nonprivate", "samples_per_s"),
        f"vanilla / best Opacus ({best}) samples/s (target >= 1.3)": ratio(summary, "vanilla", best, "samples_per_s"),
        f"vanilla / {best} peak memory (target <= 1.0)": ratio(summary, "vanilla", best, "peak_memory_mb"),
    }
    lowest = min(opacus, key=lambda c: summary[c]["peak_memory_mb"]) if opacus else None
    checks[f"vanilla / lowest-memory Opacus ({lowest}) peak memory"] = ratio(
        summary, "vanilla", lowest, "peak_memory_mb")
    print_checks(checks)
    print("saved", save("vanilla_cnn", {"batch_size": batch_size, "summary": summary, "ratios": checks,
                                         "rounds": args.rounds, "steps": args.steps}))


if __name__ == "__main__":
    main()
