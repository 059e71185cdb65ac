"""Issue 4 benchmark: a ~10M-parameter ViT on MNIST-5k at a fixed batch: nonprivate Adam, DP-Adam, DP-GRAPE.

DP-Adam runs twice: `vanilla` (dpbench's hook engine, ghost norms: per-sample gradients never materialized) and
`vanilla_functorch` (materialized B x P per-sample gradients, as the paper's DP-Adam baseline).
Targets: GRAPE peak memory <= 0.45x vanilla DP-Adam's, GRAPE samples/s >= vanilla's. With --memory-cap-mb, each
case is also measured at half the batch and the largest batch under the cap is estimated from the two points
(peak memory is affine in the batch size).
    python -m benchmarks.grape_vit [--rounds 5 --steps 20 --batch-size 64 --rank 64 --memory-cap-mb 8000]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch
from omegaconf import OmegaConf

from benchmarks.harness import (
    arguments,
    compare,
    mnist_batches,
    print_checks,
    print_table,
    private_step,
    ratio,
    save,
)
from dpbench.core.optim import OptimizerConfig, build_optimizer
from dpbench.data import DataBundle, TensorSplit
from dpbench.models.hf import ViTModelConfig, build_vit
from dpbench.privatizers import PrivacySettings, make_strategy

CASES = ["nonprivate", "vanilla", "vanilla_functorch", "grape"]
SIGMA, CLIP, LR = 1.0, 1.0, 1e-3
VIT = ViTModelConfig(patch_size=4, hidden_size=384, num_layers=6, num_heads=6, intermediate_size=1536)
"""50 tokens of 384, 6 layers: 10.7M parameters."""


def make_step(case: str, device: torch.device, batch_size: int, rank: int) -> Callable[[], None]:
    torch.manual_seed(0)
    shape = DataBundle("mnist5k", TensorSplit(torch.zeros(1, 1, 28, 28), torch.zeros(1, dtype=torch.long)),
                       TensorSplit(torch.zeros(1, 1, 28, 28), torch.zeros(1, dtype=torch.long)), 10, (1, 28, 28))
    model = build_vit(VIT, shape).to(device)
    next_batch = mnist_batches(batch_size, device)
    config = {"name": case, "rank": rank} if case == "grape" else {"name": case}
    if case == "vanilla_functorch":
        config = {"name": "vanilla", "engine": "functorch"}
    strategy = make_strategy(OmegaConf.create(config), PrivacySettings(CLIP, batch_size / 4000, SIGMA))
    strategy.attach(model)
    optimizer = (strategy.configure_optimizer(model, OptimizerConfig(name="adam", lr=LR)) if case == "grape"
                 else build_optimizer(model.parameters(), OptimizerConfig(name="adam", lr=LR)))
    return private_step(strategy, optimizer, model, next_batch, batch_size)


def _extra_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--rank", type=int, default=64)
    parser.add_argument("--memory-cap-mb", type=float, default=None)
    known, rest = parser.parse_known_args()
    sys.argv = [sys.argv[0], *rest]
    return known


def _largest_batch(full: dict, half: dict, batch_size: int, cap_mb: float) -> dict[str, int | None]:
    """Affine fit of peak memory between batch/2 and batch, solved for the cap."""
    largest = {}
    for case, row in full.items():
        low = half.get(case, {}).get("peak_memory_mb")
        high = row.get("peak_memory_mb")
        if low is None or high is None or high <= low:
            largest[case] = None
            continue
        per_sample = (high - low) / (batch_size - batch_size // 2)
        largest[case] = int((cap_mb - (high - per_sample * batch_size)) / per_sample)
    return largest


def main() -> None:
    extra = _extra_arguments()
    args = arguments(__doc__)
    batch_size = args.batch_size or 64
    params = {"rank": extra.rank}
    summary = compare("benchmarks.grape_vit", CASES, params, batch_size, args.rounds, args.steps, args.warmup,
                      args.threads)
    print_table(f"ViT 10.7M, batch {batch_size}, GRAPE rank {extra.rank}", summary, "nonprivate")
    checks = {
        "grape / vanilla peak memory (target <= 0.45)": ratio(summary, "grape", "vanilla", "peak_memory_mb"),
        "grape / vanilla samples/s (target >= 1.0)": ratio(summary, "grape", "vanilla", "samples_per_s"),
        "grape / vanilla_functorch peak memory": ratio(summary, "grape", "vanilla_functorch", "peak_memory_mb"),
        "grape / vanilla_functorch samples/s": ratio(summary, "grape", "vanilla_functorch", "samples_per_s"),
        "grape / nonprivate samples/s": ratio(summary, "grape", "nonprivate", "samples_per_s"),
    }
    print_checks(checks)
    payload = {"batch_size": batch_size, "rank": extra.rank, "summary": summary, "ratios": checks,
               "rounds": args.rounds, "steps": args.steps}
    if extra.memory_cap_mb:
        half = compare("benchmarks.grape_vit", CASES, params, batch_size // 2, 1, args.steps, args.warmup,
                       args.threads)
        largest = _largest_batch(summary, half, batch_size, extra.memory_cap_mb)
        print(f"  largest batch under {extra.memory_cap_mb:.0f} MB (affine estimate): {largest}")
        payload["largest_batch"] = {"memory_cap_mb": extra.memory_cap_mb, **largest}
    print("saved", save("grape_vit", payload))


if __name__ == "__main__":
    main()
