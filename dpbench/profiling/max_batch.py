"""Largest batch size a configuration trains at under a memory cap: doubling, then bisection.

Every trial runs a few optimizer steps in a fresh `spawn` process, so peaks never carry over between trials.
CPU: the parent polls the child's resident memory and kills it above the cap (a cap on resident memory, enforced
per trial process). CUDA: the child caps the caching allocator with set_per_process_memory_fraction, so an
allocation past the cap raises out-of-memory. A cap that the process passes before its first step (Python, torch,
data and model) is refused with the footprint it would need, rather than answered with "max batch 0".
"""

from __future__ import annotations

import math
import multiprocessing
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from queue import Empty

import torch

from dpbench.errors import ConfigurationError

RSS_POLL_S = 0.01
# What each memory figure in max_batch.json is; all in MB (2**20 bytes).
MEMORY_FIELDS = {
    "cap_mb": "the cap; cap_applies_to says what it limits",
    "process_peak_rss_mb": "highest resident set size (VmRSS) of the whole trial process seen by the parent, polled "
                           f"every {RSS_POLL_S * 1000:g} ms (a lower bound on the true peak): Python, torch, data, "
                           "model and the steps; what a CPU cap is compared with",
    "setup_rss_mb": "VmRSS of the trial process once data, model and batch are built, before the first step "
                    "(null when it was stopped earlier): the footprint a CPU cap must exceed",
    "steps_peak_mb": "the training steps' own peak, measured inside the trial by steps_peak_method (CPU: VmHWM above "
                     "the VmRSS at the first step; CUDA: the allocator's max_memory_reserved, what a CUDA cap "
                     "limits); null when the steps did not finish",
}


@dataclass
class Trial:
    """One trial at one batch size; the memory fields are described in MEMORY_FIELDS. `stage` is where a failing
    trial stopped: 'setup' (before its first step) or 'steps'."""

    batch_size: int
    fits: bool
    process_peak_rss_mb: float | None = None
    setup_rss_mb: float | None = None
    steps_peak_mb: float | None = None
    steps_peak_method: str = ""
    stage: str = ""
    reason: str = ""


@dataclass
class MaxBatchResult:
    overrides: list[str]
    cap_mb: float
    device: str
    max_batch_size: int
    cap_applies_to: str = ""
    note: str = ""
    trials: list[Trial] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def cap_applies_to(device: str) -> str:
    if device == "cuda":
        return "the trial process's CUDA caching allocator (torch.cuda.set_per_process_memory_fraction)"
    return "the trial process's resident memory (VmRSS), polled by the parent, which kills a trial above it"


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    from dpbench.cli import config_dir
    from dpbench.config import register_schemas

    register_schemas()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def trial_device(overrides: list[str]) -> str:
    """The device a trial trains on, decided once in the parent: it enforces a CPU cap itself, the child a CUDA one."""
    accelerator = _compose(overrides).trainer.accelerator
    return "cuda" if torch.cuda.is_available() and accelerator != "cpu" else "cpu"


def _train_steps(overrides: list[str], batch_size: int, steps: int, cap_mb: float, device_name: str, queue) -> None:
    """Child process: build the run's model and strategy, then train `steps` steps on a batch of exactly B."""
    try:
        from dpbench.config import Config, validated
        from dpbench.data import load_data
        from dpbench.models import build_model
        from dpbench.privatizers import PrivacySettings, make_strategy
        from dpbench.privatizers.base import StepContext
        from dpbench.profiling.memory import PeakMemory, resident_mb

        cfg = _compose(overrides)
        typed: Config = validated(Config, cfg, "top-level")
        device = torch.device(device_name)
        if device.type == "cuda":
            total = torch.cuda.get_device_properties(device).total_memory / 2**20
            torch.cuda.set_per_process_memory_fraction(min(1.0, cap_mb / total), device)
        data = load_data(cfg.data)
        model = build_model(cfg.model, data).to(device)
        sigma = typed.privacy.noise_multiplier or 1.0
        settings = PrivacySettings(typed.privacy.clip_norm, batch_size / len(data.train), sigma)
        strategy = make_strategy(cfg.privatizer, settings)
        strategy.attach(model)
        optimizer = strategy.configure_optimizer(model, typed.optimizer)
        index = torch.arange(batch_size) % len(data.train)
        inputs, targets = data.train.__getitems__(index.tolist())
        batch = (inputs.to(device) if torch.is_tensor(inputs) else {k: v.to(device) for k, v in inputs.items()},
                 targets.to(device))
        queue.put(("ready", resident_mb()))
        memory = PeakMemory(device)
        memory.start()
        for step in range(steps):
            optimizer.zero_grad(set_to_none=True)
            strategy.privatize(model, data.task, batch, StepContext(step, float(batch_size)))
            strategy.apply_update(optimizer)
        memory.stop()
        queue.put(("ok", memory.peak_mb, memory.method))
    except torch.OutOfMemoryError as error:
        queue.put(("oom", str(error).splitlines()[0]))
    except MemoryError as error:
        queue.put(("oom", repr(error)))
    except Exception:
        queue.put(("error", traceback.format_exc()))


def _resident_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def run_trial(overrides: list[str], batch_size: int, cap_mb: float, steps: int = 2, device: str | None = None) -> Trial:
    device = device or trial_device(overrides)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_train_steps, args=(overrides, batch_size, steps, cap_mb, device, queue))
    process.start()
    peak_rss, setup_rss, outcome = 0.0, None, None
    while outcome is None:
        try:
            message = queue.get(timeout=RSS_POLL_S) if process.is_alive() else queue.get(timeout=5)
        except Empty:
            if not process.is_alive():
                process.join()
                raise RuntimeError(f"trial at batch size {batch_size} died (exit code {process.exitcode})") from None
            message = None
        if message is not None and message[0] == "ready":
            setup_rss = message[1]
        elif message is not None:
            outcome = message
        peak_rss = max(peak_rss, _resident_mb(process.pid))
        if outcome is None and device == "cpu" and peak_rss > cap_mb:
            process.kill()
            process.join()
            return Trial(batch_size, False, peak_rss, setup_rss, stage="setup" if setup_rss is None else "steps",
                         reason=f"resident memory passed the {cap_mb:g} MB cap")
    process.join()
    stage = "setup" if setup_rss is None else "steps"
    if outcome[0] == "ok":
        return Trial(batch_size, True, peak_rss, setup_rss, outcome[1], outcome[2])
    if outcome[0] == "oom":
        return Trial(batch_size, False, peak_rss, setup_rss, stage=stage, reason=outcome[1])
    raise RuntimeError(f"trial at batch size {batch_size} failed:\n{outcome[1]}")


def footprint_error(overrides: list[str], batch_size: int, cap_mb: float, failed: Trial,
                    device: str) -> ConfigurationError:
    """The first trial failed before its first step: on CPU, measure without a cap what the process needs before any
    step, so the message can name a cap that can work."""
    if device == "cuda":
        return ConfigurationError(
            f"--cap-mb {cap_mb:g} is below what the model and a batch of {batch_size} need on the device before the "
            f"first step ({failed.reason}); raise --cap-mb")
    probe = run_trial(overrides, batch_size, math.inf, steps=0, device=device)
    needed = max(probe.process_peak_rss_mb or 0.0, probe.setup_rss_mb or 0.0)
    return ConfigurationError(
        f"--cap-mb {cap_mb:g} is below the trial process's own footprint: it needs about {needed:.0f} MB resident "
        f"(Python, torch, the data and the model) before its first step ({failed.reason}); raise --cap-mb well "
        f"above {needed:.0f}")


def find_max_batch(
    overrides: list[str], cap_mb: float, start: int = 8, limit: int = 1 << 16, resolution: float = 0.05,
) -> MaxBatchResult:
    """Double from `start` until a trial fails, then bisect to within `resolution` (relative); below `start` when
    even it fails. Raises ConfigurationError when the cap is below what the process needs before any step."""
    device = trial_device(overrides)
    result = MaxBatchResult(list(overrides), cap_mb, device, 0, cap_applies_to(device))

    def fits(batch_size: int) -> bool:
        trial = run_trial(overrides, batch_size, cap_mb, device=device)
        result.trials.append(trial)
        steps = f", steps {trial.steps_peak_mb:.0f} MB" if trial.steps_peak_mb is not None else ""
        print(f"  batch {batch_size:>6}: {'fits' if trial.fits else 'fails'} (process peak "
              f"{trial.process_peak_rss_mb or 0:.0f} MB resident{steps}) {trial.reason}", flush=True)
        return trial.fits

    if fits(start):
        low, high = start, None
        while high is None and low < limit:
            candidate = min(low * 2, limit)
            if fits(candidate):
                low = candidate
            else:
                high = candidate
    elif result.trials[-1].stage == "setup":
        raise footprint_error(overrides, start, cap_mb, result.trials[-1], device)
    else:
        low, high = 0, start
    while high is not None and high - low > max(1, int(low * resolution)):
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    result.max_batch_size = low
    if low == 0:
        result.note = f"not even a batch of 1 fits under {cap_mb:g} MB ({result.trials[-1].reason})"
    return result
