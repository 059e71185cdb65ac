"""Issue 5 benchmark: D2P2 (automatic clipping + Gaussian projection + decaying noise) vs vanilla DP-SGD.

Step time and peak memory on the 26K CNN (batch 256) and on cnn_large (~17M parameters, batch 32), with D2P-SGD
(automatic clipping, no projection) beside them to separate the projection's cost. Two projection paths, each at two
dimensions p per model: d2p2_p* is the default (projection=implicit: the update drawn from its exact law without
forming A, O(d + p) per step), d2p2_explicit_p* the seeded matrix regenerated block by block (O(d p) per step: d p
Gaussian entries generated twice, never stored) for reference. Target: projection overhead below 1.5x vanilla's
step time and no O(d^2) memory.
    python -m benchmarks.d2p2 [--rounds 3 --steps 5 --warmup 2]
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from omegaconf import OmegaConf

from benchmarks.harness import arguments, compare, mnist_batches, print_checks, print_table, ratio, save
from dpbench.core.tasks import ClassificationTask
from dpbench.models.cnn import LargeCNN, TFPrivacyCNN
from dpbench.privatizers import PrivacySettings, make_strategy
from dpbench.privatizers.base import StepContext

MODELS = {  # model -> (builder, batch size, dimensions p of the implicit cases, of the explicit cases)
    "cnn": (TFPrivacyCNN, 256, (64, 1024), (64, 1024)),
    "cnn_large": (LargeCNN, 32, (8, 1024), (1, 8)),  # explicit p = 1024 would take minutes a step
}
SIGMA, CLIP, LR, TRAIN_SIZE = 1.0, 1.0, 0.5, 4000


def _config(case: str) -> dict:
    """d2p2_p<p> (the default, implicit path), d2p2_explicit_p<p>, or a strategy name."""
    if case.startswith("d2p2_explicit_p"):
        return {"name": "d2p2", "dim": int(case.removeprefix("d2p2_explicit_p")), "projection": "explicit"}
    if case.startswith("d2p2_p"):
        return {"name": "d2p2", "dim": int(case.removeprefix("d2p2_p")), "projection": "implicit"}
    return {"name": case}


def make_step(case: str, device: torch.device, batch_size: int, model: str) -> Callable[[], None]:
    torch.manual_seed(0)
    network = MODELS[model][0]().to(device)
    next_batch = mnist_batches(batch_size, device)
    optimizer = torch.optim.SGD(network.parameters(), lr=LR)
    task = ClassificationTask()
    strategy = make_strategy(
        OmegaConf.create(_config(case)), PrivacySettings(CLIP, batch_size / TRAIN_SIZE, SIGMA)
    )
    strategy.prepare(network, 10**6, 1e-5, None, None)
    strategy.attach(network)
    steps = iter(range(10**9))

    def step() -> None:  # a new logical step each call: a fresh projection and noise level, as in training
        optimizer.zero_grad(set_to_none=True)
        strategy.privatize(network, task, next_batch(), StepContext(next(steps), batch_size))
        optimizer.step()

    return step


def main() -> None:
    args = arguments(__doc__, rounds=3, steps=5, warmup=2)
    results, checks = {}, {}
    for model, (_, default_batch, implicit_dims, explicit_dims) in MODELS.items():
        batch_size = args.batch_size or default_batch
        cases = ["vanilla", "d2p_sgd", *[f"d2p2_p{p}" for p in implicit_dims],
                 *[f"d2p2_explicit_p{p}" for p in explicit_dims]]
        summary = compare("benchmarks.d2p2", cases, {"model": model}, batch_size, args.rounds, args.steps,
                          args.warmup, args.threads)
        print_table(f"{model}, batch {batch_size}", summary, "vanilla")
        results[model] = {"batch_size": batch_size, "summary": summary}
        for case in cases[1:]:
            checks[f"{model}: {case} / vanilla step time (target < 1.5 for d2p2)"] = ratio(
                summary, case, "vanilla", "step_time_s")
            checks[f"{model}: {case} / vanilla peak memory"] = ratio(summary, case, "vanilla", "peak_memory_mb")
    print_checks(checks)
    print("saved", save("d2p2", {"models": results, "ratios": checks, "rounds": args.rounds, "steps": args.steps}))


if __name__ == "__main__":
    main()
