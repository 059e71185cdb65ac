"""Issue 3 benchmark: the paper's BiLSTM at batch 64, length 150 (Table 2), and the max batch under a memory cap
on the ~17M-parameter CNN (Table 3).

Speed targets: jl r=1 step time <= 2x nonprivate, jl r=5 <= 5x; vanilla samples/s >= 2x Opacus DPLSTM; jl peak
memory <= 1.2x nonprivate. JL is also shown against the baseline its paper measured, DP-SGD with every per-sample
gradient materialized (`materialized`), and against dpbench's own (`vanilla`).
Table 3 target: jl r=10's largest batch >= 0.5x nonprivate's.
    python -m benchmarks.jl_lstm [--rounds 5 --steps 20] [--memory-cap-mb 4096] [--skip-max-batch]
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from omegaconf import OmegaConf

from benchmarks.harness import (
    arguments,
    compare,
    measure,
    opacus_hooks_step,
    print_checks,
    print_table,
    ratio,
    save,
)
from dpbench.core.tasks import ClassificationTask
from dpbench.data import load_data
from dpbench.models.cnn import LargeCNN
from dpbench.models.lstm import LSTMClassifier, LSTMConfig
from dpbench.privatizers import PrivacySettings, make_strategy
from dpbench.privatizers.base import StepContext

CASES = ["nonprivate", "jl_r1", "jl_r5", "vanilla", "materialized", "opacus_dplstm"]
MAX_BATCH_CASES = ["nonprivate", "vanilla", "jl_r10"]
SIGMA, CLIP, LR = 0.6, 1.0, 1e-3
LENGTH = 150


def _strategy_config(case: str, lean: bool) -> dict:
    """lean (Table 3): JL runs its directions one at a time, so its memory does not grow with r."""
    if case.startswith("jl_r"):
        return {"name": "jl", "projections": int(case[len("jl_r"):]), "chunk_size": 1 if lean else None}
    if case == "materialized":  # the baseline Bu et al. measured JL against: every per-sample gradient built
        return {"name": "vanilla", "engine": "materialized"}
    return {"name": case}


def _dpbench_step(case: str, model: torch.nn.Module, next_batch: Callable, batch_size: int, train_size: int,
                  lean: bool = False):
    task = ClassificationTask()
    strategy = make_strategy(
        OmegaConf.create(_strategy_config(case, lean)), PrivacySettings(CLIP, batch_size / train_size, SIGMA)
    )
    strategy.attach(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        strategy.privatize(model, task, next_batch(), StepContext(0, batch_size))
        optimizer.step()

    return step


def _text_batches(batch_size: int, device: torch.device):
    data = load_data(OmegaConf.create({"name": "rotten_tomatoes", "max_length": LENGTH}))
    generator = torch.Generator().manual_seed(0)

    def next_batch():
        index = torch.randint(0, len(data.train), (batch_size,), generator=generator)
        x, y = data.train.__getitems__(index.tolist())
        return x.to(device), y.to(device)

    return data, next_batch


def _opacus_step(model: LSTMClassifier, next_batch: Callable, batch_size: int):
    from opacus import GradSampleModule
    from opacus.layers import DPLSTM
    from opacus.optimizers import DPOptimizer

    lstm = model.lstm
    model.lstm = DPLSTM(lstm.input_size, lstm.hidden_size, num_layers=lstm.num_layers, batch_first=True,
                        bidirectional=lstm.bidirectional).to(next(model.parameters()).device)
    wrapped = GradSampleModule(model)
    optimizer = DPOptimizer(torch.optim.Adam(model.parameters(), lr=LR), noise_multiplier=SIGMA, max_grad_norm=CLIP,
                            expected_batch_size=batch_size)
    return opacus_hooks_step(wrapped, optimizer, next_batch)


def make_step(case: str, device: torch.device, batch_size: int, model_kind: str = "lstm") -> Callable[[], None]:
    torch.manual_seed(0)
    if model_kind == "cnn_large":  # Table 3: random MNIST-shaped batches are enough to measure memory
        model = LargeCNN().to(device)

        def next_image_batch():
            return torch.randn(batch_size, 1, 28, 28, device=device), torch.randint(0, 10, (batch_size,), device=device)

        return _dpbench_step(case, model, next_image_batch, batch_size, 60_000, lean=True)
    data, next_batch = _text_batches(batch_size, device)
    model = LSTMClassifier(data.vocab_size, data.num_classes, LSTMConfig()).to(device)
    if case == "opacus_dplstm":
        return _opacus_step(model, next_batch, batch_size)
    return _dpbench_step(case, model, next_batch, batch_size, len(data.train))


def max_batch(case: str, cap_mb: float, threads: int, sizes: tuple[int, int] = (64, 512)) -> dict:
    """Largest batch whose peak step memory stays under the cap, from a linear fit of the peak at two batch sizes
    (fresh process each): peak(B) = base + B * per_sample. Sizes far apart keep the slope above the few MB of
    resident-size noise (16 and 64 gave fits that moved the answer by a factor of two between runs)."""
    peaks = []
    for size in sizes:
        result = measure("benchmarks.jl_lstm", case, {"batch_size": size, "model_kind": "cnn_large"}, 1, 1, threads)
        if "error" in result:
            return result
        peaks.append(result["peak_memory_mb"])
    per_sample = max((peaks[1] - peaks[0]) / (sizes[1] - sizes[0]), 1e-6)
    base = peaks[0] - per_sample * sizes[0]
    return {"peaks_mb": dict(zip(sizes, peaks, strict=True)), "per_sample_mb": per_sample,
            "max_batch": int(max(0.0, (cap_mb - base) / per_sample))}


def main() -> None:
    cap_mb, skip_max_batch = 4096.0, "--skip-max-batch" in sys.argv
    if "--memory-cap-mb" in sys.argv:
        at = sys.argv.index("--memory-cap-mb")
        cap_mb = float(sys.argv[at + 1])
        del sys.argv[at : at + 2]
    sys.argv = [a for a in sys.argv if a != "--skip-max-batch"]
    args = arguments(__doc__)
    batch_size = args.batch_size or 64
    summary = compare("benchmarks.jl_lstm", CASES, {}, batch_size, args.rounds, args.steps, args.warmup, args.threads)
    print_table(f"BiLSTM (vocab 8,000, length {LENGTH}), batch {batch_size}", summary, "nonprivate")
    checks = {
        "jl r=1 / nonprivate step time (target <= 2)": ratio(summary, "jl_r1", "nonprivate", "step_time_s"),
        "jl r=5 / nonprivate step time (target <= 5)": ratio(summary, "jl_r5", "nonprivate", "step_time_s"),
        "vanilla / Opacus DPLSTM samples/s (target >= 2)": ratio(summary, "vanilla", "opacus_dplstm", "samples_per_s"),
        "jl r=1 / materialized DP-SGD step time (the paper's baseline)": ratio(summary, "jl_r1", "materialized",
                                                                               "step_time_s"),
        "jl r=1 / materialized DP-SGD peak memory": ratio(summary, "jl_r1", "materialized", "peak_memory_mb"),
        "jl r=1 / ghost-norm DP-SGD step time": ratio(summary, "jl_r1", "vanilla", "step_time_s"),
        "jl r=1 / nonprivate peak memory (target <= 1.2)": ratio(summary, "jl_r1", "nonprivate", "peak_memory_mb"),
        "jl r=5 / nonprivate peak memory (target <= 1.2)": ratio(summary, "jl_r5", "nonprivate", "peak_memory_mb"),
    }
    largest = {}
    if not skip_max_batch:
        print(f"\nTable 3: largest batch under {cap_mb:.0f} MB on the ~17M-parameter CNN (linear fit of peak memory)")
        for case in MAX_BATCH_CASES:
            largest[case] = max_batch(case, cap_mb, args.threads)
            print(f"  {case:>12}: {largest[case]}", flush=True)
        if all("max_batch" in largest[c] for c in ("jl_r10", "nonprivate")):
            checks["jl r=10 / nonprivate max batch (target >= 0.5)"] = (
                largest["jl_r10"]["max_batch"] / max(largest["nonprivate"]["max_batch"], 1))
    print_checks(checks)
    print("saved", save("jl_lstm", {"batch_size": batch_size, "summary": summary, "ratios": checks,
                                     "max_batch": largest, "memory_cap_mb": cap_mb, "rounds": args.rounds,
                                     "steps": args.steps}))


if __name__ == "__main__":
    main()
