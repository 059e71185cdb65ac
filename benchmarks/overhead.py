"""Issue 26 benchmark: the cost of a private step against a non-private one, per model, with Opacus beside it.

For each model the cases (nonprivate, dpbench vanilla, Opacus 1.6's fastest mode for it, and JL r=10 on the CNN and
ViT, eager and with privatizer.compile) are measured side by side in interleaved rounds (benchmarks/harness.py), one
thread by default as in the issue's profile. Targets: vanilla / nonprivate step time <= 1.25 (CNN), 1.3 (ViT), 1.7
(BiLSTM), 1.2 (MiniLM); JL r=10 / vanilla <= 3 (CNN), 5 (ViT).
    python -m benchmarks overhead [--quick] [--eager-only] [--models cnn,vit] [--rounds 3 --steps 10 --threads 1]
--eager-only leaves out the compiled JL case, whose compilation takes up to a minute a model and fresh process.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from omegaconf import OmegaConf
from torch import nn
from torch.utils._pytree import tree_map

from benchmarks.harness import (
    arguments,
    compare,
    mnist_batches,
    opacus_ghost_step,
    opacus_hooks_step,
    print_checks,
    print_table,
    private_step,
    ratio,
    save,
)
from dpbench.core.optim import OptimizerConfig, build_optimizer
from dpbench.data import load_data
from dpbench.models import build_model
from dpbench.privatizers import PrivacySettings, make_strategy

SIGMA, CLIP = 1.0, 1.0
MODELS: dict[str, dict[str, Any]] = {
    "cnn": {"batch": 256, "optimizer": ("sgd", 0.5), "opacus": "ghost", "target": 1.25, "jl_target": 3.0},
    "vit": {"batch": 500, "optimizer": ("adam", 1e-3), "opacus": "ghost", "target": 1.3, "jl_target": 5.0},
    "lstm": {"batch": 64, "optimizer": ("adam", 1e-3), "opacus": "dplstm", "target": 1.7},
    "minilm": {"batch": 32, "optimizer": ("adam", 5e-5), "opacus": "hooks", "target": 1.2},
}
"""Batch sizes of the issue's profile; `opacus`: the Opacus mode measured (ghost clipping where Opacus has it)."""
TRAIN_SIZE = 4000
TEXT_LENGTH = {"lstm": 150, "minilm": 64}


def _model_and_batches(model_name: str, batch_size: int, device: torch.device) -> tuple[nn.Module, Callable]:
    """The model as `model=NAME` builds it (conf/model defaults), and seeded random batches of its data."""
    conf = OmegaConf.load(f"conf/model/{model_name}.yaml")
    if model_name in ("cnn", "vit"):
        data = load_data(OmegaConf.create({"name": "mnist5k"}))
        return build_model(conf, data).to(device), mnist_batches(batch_size, device)
    tokenizer = "word" if model_name == "lstm" else conf.tokenizer
    data = load_data(OmegaConf.create({"name": "rotten_tomatoes", "tokenizer": tokenizer,
                                       "max_length": TEXT_LENGTH[model_name]}))
    model = build_model(conf, data).to(device)
    generator = torch.Generator().manual_seed(0)

    def next_batch():
        index = torch.randint(0, len(data.train), (batch_size,), generator=generator)
        x, y = data.train.__getitems__(index.tolist())
        return tree_map(lambda t: t.to(device), x), y.to(device)

    return model, next_batch


def _dpbench_step(case: str, model: nn.Module, next_batch: Callable, batch_size: int, optimizer_config) -> Callable:
    config = {"name": case}
    if case.startswith("jl_r10"):
        config = {"name": "jl", "projections": 10, "compile": case == "jl_r10_compiled"}
    strategy = make_strategy(OmegaConf.create(config), PrivacySettings(CLIP, batch_size / TRAIN_SIZE, SIGMA))
    strategy.attach(model)
    optimizer = strategy.configure_optimizer(model, optimizer_config)
    return private_step(strategy, optimizer, model, next_batch, batch_size)


def _opacus_step(mode: str, model: nn.Module, next_batch: Callable, batch_size: int, optimizer_config) -> Callable:
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    if mode == "dplstm":
        from opacus.layers import DPLSTM

        lstm = model.lstm
        model.lstm = DPLSTM(lstm.input_size, lstm.hidden_size, num_layers=lstm.num_layers, batch_first=True,
                            bidirectional=lstm.bidirectional).to(next(model.parameters()).device)
    optimizer = build_optimizer([p for p in model.parameters() if p.requires_grad], optimizer_config)
    if mode == "ghost":
        return opacus_ghost_step(model, optimizer, batch_size, CLIP, SIGMA, next_batch)
    wrapped = GradSampleModule(model)
    dp_optimizer = DPOptimizer(optimizer, noise_multiplier=SIGMA, max_grad_norm=CLIP, expected_batch_size=batch_size)

    return opacus_hooks_step(wrapped, dp_optimizer, next_batch)


def make_step(case: str, device: torch.device, batch_size: int, model_name: str) -> Callable[[], None]:
    torch.manual_seed(0)
    model, next_batch = _model_and_batches(model_name, batch_size, device)
    name, lr = MODELS[model_name]["optimizer"]
    optimizer_config = OptimizerConfig(name=name, lr=lr)
    if case == "opacus":
        return _opacus_step(MODELS[model_name]["opacus"], model, next_batch, batch_size, optimizer_config)
    return _dpbench_step(case, model, next_batch, batch_size, optimizer_config)


def cases(model_name: str, compiled: bool = True) -> list[str]:
    jl_cases = ["jl_r10", *(["jl_r10_compiled"] if compiled else [])] if "jl_target" in MODELS[model_name] else []
    return ["nonprivate", "vanilla", "opacus", *jl_cases]


def checks(model_name: str, summary: dict) -> dict[str, float | None]:
    """The issue's ratios, as step-time ratios (larger is slower), and the ratios of the steps' arithmetic beside
    them: a time ratio below the arithmetic's means the private step's kernels run more efficiently."""
    spec = MODELS[model_name]
    found = {
        f"{model_name}: vanilla / nonprivate (target <= {spec['target']})":
            ratio(summary, "vanilla", "nonprivate", "step_time_s"),
        f"{model_name}: Opacus {spec['opacus']} / nonprivate": ratio(summary, "opacus", "nonprivate", "step_time_s"),
        f"{model_name}: vanilla / nonprivate peak memory": ratio(summary, "vanilla", "nonprivate", "peak_memory_mb"),
        f"{model_name}: vanilla / nonprivate memory a step allocates": ratio(summary, "vanilla", "nonprivate",
                                                                           "step_allocated_mb"),
        f"{model_name}: vanilla / nonprivate arithmetic (GFLOP)": ratio(summary, "vanilla", "nonprivate",
                                                                       "step_gflop"),
    }
    if "jl_target" in spec:
        found[f"{model_name}: jl r=10 / vanilla (target <= {spec['jl_target']})"] = ratio(
            summary, "jl_r10", "vanilla", "step_time_s")
        found[f"{model_name}: jl r=10 compiled / vanilla (target <= {spec['jl_target']})"] = ratio(
            summary, "jl_r10_compiled", "vanilla", "step_time_s")
        found[f"{model_name}: jl r=10 / vanilla arithmetic (GFLOP)"] = ratio(summary, "jl_r10", "vanilla",
                                                                             "step_gflop")
    return found


def _models_argument() -> tuple[list[str], bool, bool]:
    """--models a,b, --quick (2 rounds x 3 steps, 1 warmup) and --eager-only, taken off argv before the shared
    arguments."""
    models, quick, compiled = list(MODELS), "--quick" in sys.argv, "--eager-only" not in sys.argv
    if "--models" in sys.argv:
        at = sys.argv.index("--models")
        models = sys.argv[at + 1].split(",")
        del sys.argv[at : at + 2]
    sys.argv = [a for a in sys.argv if a not in ("--quick", "--eager-only")]
    unknown = set(models) - set(MODELS)
    if unknown:
        raise SystemExit(f"--models: unknown {sorted(unknown)}; choose from {list(MODELS)}")
    if quick:
        sys.argv += ["--rounds", "2", "--steps", "3", "--warmup", "1"]
    if "--threads" not in sys.argv:
        sys.argv += ["--threads", "1"]
    return models, quick, compiled


def main() -> None:
    models, quick, compiled = _models_argument()
    args = arguments(__doc__)
    results, all_checks = {}, {}
    for model_name in models:
        batch_size = args.batch_size or MODELS[model_name]["batch"]
        print(f"\n--- {model_name}, batch {batch_size} ---", flush=True)
        summary = compare("benchmarks.overhead", cases(model_name, compiled), {"model_name": model_name}, batch_size,
                          args.rounds, args.steps, args.warmup, args.threads)
        print_table(f"{model_name}, batch {batch_size}", summary, "nonprivate")
        found = checks(model_name, summary)
        print_checks(found)
        results[model_name] = {"batch_size": batch_size, "summary": summary}
        all_checks.update(found)
    print("\nAll ratios (step time; interleaved rounds, medians):")
    print_checks(all_checks)
    print("saved", save("overhead", {"models": results, "ratios": all_checks, "rounds": args.rounds,
                                     "steps": args.steps, "threads": args.threads, "quick": quick}))


if __name__ == "__main__":
    main()
