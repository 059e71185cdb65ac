"""Side-by-side step-time and peak-memory measurement, one fresh process per measurement.

Each case is set up in a new `spawn` process (so its peak memory is its own), timed over `steps` steps after
`warmup`, and the cases are measured alternately for `rounds` rounds so that load from other processes on a
shared machine hits all of them alike. Figures are medians over rounds. Each case also reports its minor page faults
per timed step (host memory). Every measured process keeps the memory its steps free, as dpbench's runs do
(dpbench/training/host_memory.py): under glibc's defaults some processes hand large freed blocks back to the kernel
at every step and fault them in again, which adds up to 40% to a step in one process and nothing in the next;
`--allocator-defaults` measures under glibc's defaults instead. On CPU one more step,
profiled, gives "step MB": the tensor memory a step holds at its peak, which the resident peak overstates by what the
allocator keeps (benchmarks/step_allocation.py). One more step, counted, gives "GFLOP": the arithmetic of its products
(benchmarks/step_flops.py), the floor against which a ratio of step times is read.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import os
import platform
import resource
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from benchmarks.step_allocation import step_allocated_mb
from benchmarks.step_flops import step_gflop
from dpbench.profiling.memory import PeakMemory
from dpbench.training.host_memory import DEFAULTS, keep_freed_host_memory

ALLOCATOR_DEFAULTS = "DPBENCH_BENCH_ALLOCATOR_DEFAULTS"
"""Set (by --allocator-defaults) in the environment the measured processes start with: they leave glibc as it is."""


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _measure(module_name: str, case: str, params: dict[str, Any], steps: int, warmup: int, threads: int, queue):
    try:
        host_memory = DEFAULTS if os.environ.get(ALLOCATOR_DEFAULTS) else keep_freed_host_memory()
        torch.set_num_threads(threads)
        device = _device()
        step = importlib.import_module(module_name).make_step(case, device=device, **params)
        memory = PeakMemory(device)
        memory.start()
        times, faults = [], resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for index in range(warmup + steps):
            if index == warmup:
                faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            started = time.perf_counter()
            step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - started)
        memory.stop()
        faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / max(steps, 1)
        allocated = step_allocated_mb(step) if device.type == "cpu" else None  # one more step, profiled
        queue.put({"step_time_s": statistics.median(times[warmup:]), "peak_memory_mb": memory.peak_mb,
                   "step_allocated_mb": allocated, "page_faults_per_step": faults,
                   "step_gflop": _counted_or_none(step), "host_memory": host_memory})
    except Exception as error:  # reported as a failed case, not a crashed benchmark
        queue.put({"error": f"{type(error).__name__}: {error}"})


def _counted_or_none(step: Callable[[], None]) -> float | None:
    """One more step, counted; a counter that cannot follow some op loses the count, not the case's timings."""
    try:
        return step_gflop(step)
    except Exception as error:  # reported beside the figures, the case stays measured
        print(f"  (arithmetic not counted: {type(error).__name__}: {error})", flush=True)
        return None


def measure(module_name: str, case: str, params: dict[str, Any], steps: int, warmup: int, threads: int) -> dict:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_measure, args=(module_name, case, params, steps, warmup, threads, queue))
    process.start()
    result = queue.get()
    process.join()
    return result


def compare(
    module_name: str, cases: list[str], params: dict[str, Any], batch_size: int, rounds: int, steps: int,
    warmup: int, threads: int,
) -> dict[str, dict[str, float]]:
    """Median step time, samples/s and peak memory per case, the cases alternating within each round."""
    raw: dict[str, list[dict]] = {case: [] for case in cases}
    for round_index in range(rounds):
        for case in cases:
            result = measure(module_name, case, {**params, "batch_size": batch_size}, steps, warmup, threads)
            raw[case].append(result)
            print(f"  round {round_index + 1}/{rounds} {case:>18}: {result}", flush=True)
    summary = {}
    for case, results in raw.items():
        ok = [r for r in results if "error" not in r]
        if not ok:
            summary[case] = {"error": results[0]["error"]}
            continue
        step_time = statistics.median(r["step_time_s"] for r in ok)
        summary[case] = {
            "step_time_s": step_time,
            "samples_per_s": batch_size / step_time,
            "peak_memory_mb": statistics.median(r["peak_memory_mb"] for r in ok),
            "step_allocated_mb": _median_or_none([r["step_allocated_mb"] for r in ok]),
            "page_faults_per_step": statistics.median(r["page_faults_per_step"] for r in ok),
            "step_gflop": _median_or_none([r["step_gflop"] for r in ok]),
        }
    return summary


def _median_or_none(values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def print_table(title: str, summary: dict[str, dict[str, float]], baseline: str) -> None:
    print(f"\n{title}")
    print(f"{'case':>20} {'step ms':>9} {'samples/s':>10} {'peak MB':>9} {'step MB':>9} {'faults/step':>12} "
          f"{'GFLOP':>8} {'speed vs ' + baseline:>22}")
    base = summary.get(baseline, {}).get("samples_per_s")
    for case, row in summary.items():
        if "error" in row:
            print(f"{case:>20}  failed: {row['error']}")
            continue
        ratio = f"{row['samples_per_s'] / base:.2f}x" if base else "-"
        allocated = "-" if row.get("step_allocated_mb") is None else f"{row['step_allocated_mb']:.1f}"
        gflop = "-" if row.get("step_gflop") is None else f"{row['step_gflop']:.2f}"
        print(f"{case:>20} {row['step_time_s'] * 1e3:9.1f} {row['samples_per_s']:10.0f} "
              f"{row['peak_memory_mb']:9.1f} {allocated:>9} {row['page_faults_per_step']:12.0f} "
              f"{gflop:>8} {ratio:>22}")


def print_checks(checks: dict[str, float | None]) -> None:
    """The ratios a benchmark's targets are stated in, one a line."""
    for label, value in checks.items():
        print(f"  {label}: {value:.2f}" if value is not None else f"  {label}: n/a")


def ratio(summary: dict, numerator: str, denominator: str, key: str) -> float | None:
    a, b = summary.get(numerator, {}).get(key), summary.get(denominator, {}).get(key)
    return a / b if a is not None and b else None


def machine() -> str:
    device = _device()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    return f"{platform.node()} {device.type} {name}, torch {torch.__version__}, {torch.get_num_threads()} threads"


def save(name: str, payload: dict) -> Path:
    out = Path("bench_results")
    out.mkdir(exist_ok=True)
    path = out / f"{name}.json"
    host_memory = DEFAULTS if os.environ.get(ALLOCATOR_DEFAULTS) else "freed memory kept (dpbench's runs' setting)"
    payload = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
               "host_memory": host_memory, **payload}
    path.write_text(json.dumps(payload, indent=2))
    return path


def arguments(description: str, rounds: int = 3, steps: int = 10, warmup: int = 3) -> argparse.Namespace:
    """The shared command line; --allocator-defaults applies to the measured processes, which `spawn` starts with
    this process's environment."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--warmup", type=int, default=warmup)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--allocator-defaults", action="store_true",
                        help="glibc's own thresholds in the measured processes, not dpbench's (freed memory kept)")
    args = parser.parse_args()
    if args.allocator_defaults:
        os.environ[ALLOCATOR_DEFAULTS] = "1"
    return args


def mnist_batches(batch_size: int, device: torch.device) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """Random fixed-size batches of the embedded MNIST-5k training split, from a seeded generator."""
    from omegaconf import OmegaConf

    from dpbench.data import load_data

    data = load_data(OmegaConf.create({"name": "mnist5k"})).train
    generator = torch.Generator().manual_seed(0)

    def next_batch():
        index = torch.randint(0, len(data), (batch_size,), generator=generator)
        x, y = data.__getitems__(index.tolist())
        return x.to(device), y.to(device)

    return next_batch


def private_step(strategy: Any, optimizer: torch.optim.Optimizer, model: torch.nn.Module,
                 next_batch: Callable[[], Any], batch_size: int) -> Callable[[], None]:
    """One call, one private step of a dpbench strategy on a classification batch, as a run takes it
    (dpbench.training.step: its per-step guards and the ledger included), counting steps (the per-sample check's
    schedule reads them)."""
    from dpbench.core.tasks import ClassificationTask
    from dpbench.privacy.ledger import PrivacyLedger
    from dpbench.privatizers.base import StepContext
    from dpbench.training.step import private_step as run_step

    task, ledger = ClassificationTask(), PrivacyLedger(1e-5)

    def step() -> None:
        run_step(strategy, model, task, optimizer, ledger, next_batch(), StepContext(ledger.steps, batch_size))

    return step


def opacus_hooks_step(wrapped: torch.nn.Module, dp_optimizer: Any,
                      next_batch: Callable[[], tuple[torch.Tensor, torch.Tensor]]) -> Callable[[], None]:
    """One call, one step of an Opacus GradSampleModule with its DPOptimizer (cross-entropy)."""
    from torch.nn import functional

    def step() -> None:
        x, y = next_batch()
        dp_optimizer.zero_grad(set_to_none=True)
        functional.cross_entropy(wrapped(x), y).backward()
        dp_optimizer.step()

    return step


def opacus_ghost_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch_size: int, clip: float,
                      sigma: float, next_batch: Callable[[], tuple[torch.Tensor, torch.Tensor]]) -> Callable[[], None]:
    """One call, one step of Opacus's ghost clipping (its fastest mode where it supports the model)."""
    from opacus.grad_sample import GradSampleModuleFastGradientClipping
    from opacus.optimizers import DPOptimizerFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

    wrapped = GradSampleModuleFastGradientClipping(model, max_grad_norm=clip, use_ghost_clipping=True)
    dp_optimizer = DPOptimizerFastGradientClipping(optimizer, noise_multiplier=sigma, max_grad_norm=clip,
                                                   expected_batch_size=batch_size)
    criterion = DPLossFastGradientClipping(wrapped, dp_optimizer, torch.nn.CrossEntropyLoss(), "mean")

    def step() -> None:
        x, y = next_batch()
        dp_optimizer.zero_grad(set_to_none=True)
        criterion(wrapped(x), y).backward()
        dp_optimizer.step()

    return step
