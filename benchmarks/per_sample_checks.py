"""Issue 23 benchmark: what the per-sample checks cost (the one before the first step, and the ones during training).

Each case is a fresh `spawn` process (its own peak memory) that runs `--steps` private steps of one model and
privatizer, with the engine's checks as dpbench runs them (`checked`) or with none at all (`unchecked`, not a mode
dpbench offers: the baseline the check's cost is read from). Reported: the first step's time (which holds the first
check), the median time of the later steps, and the working set (the peak of malloc's bytes in use over the steps,
above the state after building the model: dpbench/profiling/working_set.py), whose ratio is the checks' memory cost.
The checks after the first are bounded by their schedule (2% of the training time); `--long-steps N` also runs N
steps of the CNN and prints the checked steps and their share of the time.

    python -m benchmarks.per_sample_checks [--models cnn,vit,lstm,minilm,opt125m] [--privatizers vanilla,grape,jl]
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from typing import Any

import torch
from omegaconf import OmegaConf

from benchmarks.harness import machine, save
from dpbench.core.optim import OptimizerConfig, build_optimizer
from dpbench.core.tasks import ClassificationTask
from dpbench.data import DataBundle, TensorSplit, load_data
from dpbench.models import build_model
from dpbench.privatizers import PrivacySettings, make_strategy
from dpbench.privatizers.base import StepContext
from dpbench.profiling.working_set import PeakInUse, in_use_bytes

MODELS: dict[str, dict[str, Any]] = {
    "cnn": {"model": {"name": "cnn"}, "batch": 256, "image": True},
    "vit": {"model": {"name": "vit"}, "batch": 256, "image": True},
    "minilm": {"model": {"name": "minilm", "pretrained": "minilm"}, "batch": 32, "length": 64},
    "lstm": {"model": {"name": "lstm"}, "batch": 64, "data": {"name": "rotten_tomatoes", "max_length": 150}},
    "opt125m": {"model": {"name": "opt", "size": "125m"}, "batch": 4, "length": 32},
    "opt334m": {"model": {"name": "opt", "hidden_size": 1024, "num_layers": 24, "num_heads": 16,
                          "intermediate_size": 4096}, "batch": 4, "length": 32},
}
PRIVATIZERS = {"vanilla": {"name": "vanilla"}, "grape": {"name": "grape", "rank": 8},
               "jl": {"name": "jl", "projections": 1}}


def _data(spec: dict[str, Any]) -> DataBundle:
    if "data" in spec:  # the model's own data set (the BiLSTM's vocabulary)
        return load_data(OmegaConf.create(spec["data"]))
    batch = spec["batch"]
    targets = torch.randint(0, 2, (batch,))
    if spec.get("image"):
        images = TensorSplit(torch.randn(batch, 1, 28, 28), targets)
        return DataBundle("mnist-shaped", images, images, 10, (1, 28, 28))
    ids = torch.randint(1000, 20000, (batch, spec["length"]))
    text = TensorSplit({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, targets)
    return DataBundle("tokens", text, text, 2)


def _setup(model_name: str, privatizer: str, checked: bool):
    torch.manual_seed(0)
    spec = MODELS[model_name]
    data = _data(spec)
    model = build_model(OmegaConf.create(spec["model"]), data)
    strategy = make_strategy(OmegaConf.create(PRIVATIZERS[privatizer]), PrivacySettings(1.0, 0.01, 1.0))
    if not checked:
        strategy.checks.due = lambda: False
    strategy.attach(model)
    adam = OptimizerConfig(name="adam", lr=1e-4)
    optimizer = (strategy.configure_optimizer(model, adam) if privatizer == "grape"
                 else build_optimizer(model.parameters(), adam))
    return model, strategy, optimizer, data.train.__getitems__(list(range(spec["batch"]))), float(spec["batch"])


def _step(model, strategy, optimizer, batch, size: float, step: int) -> None:
    optimizer.zero_grad(set_to_none=True)
    strategy.privatize(model, ClassificationTask(), batch, StepContext(step, size))
    strategy.apply_update(optimizer)


def _run(model_name: str, privatizer: str, checked: bool, steps: int, queue) -> None:
    try:
        model, strategy, optimizer, batch, size = _setup(model_name, privatizer, checked)
        times = []
        for step in range(steps):  # timed without the working set's reads
            started = time.perf_counter()
            _step(model, strategy, optimizer, batch, size, step)
            times.append(time.perf_counter() - started)
        parameters = sum(p.numel() for p in model.parameters())
        del model, strategy, optimizer
        fresh = _setup(model_name, privatizer, checked)  # the first step (and its check) again, under the reads
        baseline = in_use_bytes()
        with PeakInUse() as reading:
            for step in range(2):
                _step(*fresh, step)
        queue.put({"first_step_s": times[0], "step_s": statistics.median(times[1:]),
                   "peak_mb": (reading.peak - baseline) / 2**20, "parameters": parameters})
    except Exception as error:  # a failed case is reported, not a crashed benchmark
        queue.put({"error": f"{type(error).__name__}: {error}"})


def measure(model_name: str, privatizer: str, checked: bool, steps: int) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_run, args=(model_name, privatizer, checked, steps, queue))
    process.start()
    result = queue.get()
    process.join()
    return result


def long_run(steps: int) -> dict[str, Any]:
    """The CNN over `steps` steps with the default schedule: which steps were checked, and the checks' share."""
    torch.manual_seed(0)
    spec = MODELS["cnn"]
    data = _data(spec)
    model = build_model(OmegaConf.create(spec["model"]), data)
    strategy = make_strategy(OmegaConf.create({"name": "vanilla"}), PrivacySettings(1.0, 0.01, 1.0))
    strategy.attach(model)
    optimizer = build_optimizer(model.parameters(), OptimizerConfig(name="sgd", lr=0.1))
    batch = data.train.__getitems__(list(range(spec["batch"])))
    started = time.perf_counter()
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        strategy.privatize(model, ClassificationTask(), batch, StepContext(step, float(spec["batch"])))
        strategy.apply_update(optimizer)
    report = strategy.checks.report()
    return {**report, "training_s": time.perf_counter() - started,
            "share": report["check_time_s"] / (time.perf_counter() - started)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="cnn,vit,lstm,minilm,opt125m")
    parser.add_argument("--privatizers", default="vanilla,grape,jl")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--long-steps", type=int, default=0)
    args, _ = parser.parse_known_args()
    rows = []
    print(f"{'model':>8} {'privatizer':>10} {'params':>8} {'first step s (check / none)':>28} "
          f"{'later step s':>13} {'working set MB (check / none)':>31} {'ratio':>6}")
    for model_name in args.models.split(","):
        for privatizer in args.privatizers.split(","):
            on = measure(model_name, privatizer, True, args.steps)
            off = measure(model_name, privatizer, False, args.steps)
            rows.append({"model": model_name, "privatizer": privatizer, "checked": on, "unchecked": off})
            if "error" in on or "error" in off:
                print(f"{model_name:>8} {privatizer:>10}  failed: {on.get('error') or off.get('error')}")
                continue
            print(f"{model_name:>8} {privatizer:>10} {on['parameters'] / 1e6:7.1f}M "
                  f"{on['first_step_s']:13.2f} / {off['first_step_s']:<12.2f} {on['step_s']:13.2f} "
                  f"{on['peak_mb']:11.0f} / {off['peak_mb']:<10.0f} {on['peak_mb'] / off['peak_mb']:10.2f}",
                  flush=True)
    payload: dict[str, Any] = {"machine": machine(), "steps": args.steps, "cases": rows}
    if args.long_steps:
        payload["long_run"] = long_run(args.long_steps)
        print(f"CNN over {args.long_steps} steps: checked at {payload['long_run']['checked_steps']}, checks after "
              f"the first {payload['long_run']['check_time_s']:.2f} s = {payload['long_run']['share']:.2%} of "
              f"{payload['long_run']['training_s']:.1f} s")
    print(f"saved {save('per_sample_checks', payload)}")


if __name__ == "__main__":
    main()
