"""Issue 6 benchmark: word2vec (100-dim, CBOW, window 4, 8 negatives) with vocabulary 1k and 20k, sparse vs vanilla.

Vanilla DP-SGD (the dense reference) adds noise to, and Adam-updates, every one of the V x 100 coordinates each
step; sparse touches the batch's rows, the k = sparsity * p selected coordinates and their Adam state only.
Target: sparse samples/s at 20k within 1.5x of its 1k figure. Batches are random ids (no corpus to load).
    python -m benchmarks.sparse_word2vec [--rounds 5 --steps 20 --batch-size 20]
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from omegaconf import OmegaConf

from benchmarks.harness import arguments, compare, print_checks, print_table, ratio, save
from dpbench.core.optim import OptimizerConfig
from dpbench.core.tasks import NegativeSamplingTask
from dpbench.models.word2vec import Word2Vec
from dpbench.privatizers import PrivacySettings, make_strategy
from dpbench.privatizers.base import StepContext

VOCABULARIES = {"1k": 1000, "20k": 20000}
CASES = [f"{name}_{size}" for size in VOCABULARIES for name in ("sparse", "vanilla")]
SIGMA, S1, LR, DIM = 0.5, 15.0, 1e-3, 100


def make_step(case: str, device: torch.device, batch_size: int) -> Callable[[], None]:
    name, size = case.split("_")
    vocab = VOCABULARIES[size]
    torch.manual_seed(0)
    model = Word2Vec(vocab, DIM).to(device)
    generator = torch.Generator().manual_seed(0)
    config = {"name": "sparse", "draw_epsilon": 0.01} if name == "sparse" else {"name": "vanilla", "engine": "hooks"}
    strategy = make_strategy(OmegaConf.create(config), PrivacySettings(S1, batch_size / 200_000, SIGMA))
    strategy.attach(model)
    optimizer = strategy.configure_optimizer(model, OptimizerConfig(name="adam", lr=LR))
    task = NegativeSamplingTask()

    def step() -> None:
        ids = torch.randint(vocab, (batch_size, 13), generator=generator).to(device)
        batch = ({"center": ids[:, 0], "context": ids[:, 1:5], "negatives": ids[:, 5:]}, ids[:, 0])
        optimizer.zero_grad(set_to_none=True)
        strategy.privatize(model, task, batch, StepContext(0, float(batch_size)))
        strategy.apply_update(optimizer)

    return step


def main() -> None:
    args = arguments(__doc__)
    batch_size = args.batch_size or 20
    summary = compare("benchmarks.sparse_word2vec", CASES, {}, batch_size, args.rounds, args.steps, args.warmup,
                      args.threads)
    print_table(f"word2vec, batch {batch_size}", summary, "vanilla_1k")
    checks = {
        "sparse 20k / 1k samples/s (target >= 0.67)": ratio(summary, "sparse_20k", "sparse_1k", "samples_per_s"),
        "vanilla 20k / 1k samples/s": ratio(summary, "vanilla_20k", "vanilla_1k", "samples_per_s"),
        "sparse / vanilla samples/s at 1k": ratio(summary, "sparse_1k", "vanilla_1k", "samples_per_s"),
        "sparse / vanilla samples/s at 20k": ratio(summary, "sparse_20k", "vanilla_20k", "samples_per_s"),
        "sparse 20k / 1k peak memory": ratio(summary, "sparse_20k", "sparse_1k", "peak_memory_mb"),
        "vanilla 20k / 1k peak memory": ratio(summary, "vanilla_20k", "vanilla_1k", "peak_memory_mb"),
    }
    print_checks(checks)
    print("saved", save("sparse_word2vec", {"batch_size": batch_size, "summary": summary, "ratios": checks,
                                             "rounds": args.rounds, "steps": args.steps}))


if __name__ == "__main__":
    main()
