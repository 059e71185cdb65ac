"""Largest batch size a configuration trains at under a memory cap: doubling, then bisection.

Every trial runs a few optimizer steps in a fresh `spawn` process, so peaks never carry over between trials.
CPU: the parent polls the child's resident memory and kills it above the cap (a cap on resident memory, enforced
per trial process). CUDA: the child caps the caching allocator with set_per_process_memory_fraction, so an
allocation past the cap raises out-of-memory.
"""

from __future__ import annotations

import multiprocessing
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

RSS_POLL_S = 0.01


@dataclass
class Trial:
    batch_size: int
    fits: bool
    peak_memory_mb: float | None
    reason: str = ""


@dataclass
class MaxBatchResult:
    overrides: list[str]
    cap_mb: float
    device: str
    max_batch_size: int
    trials: list[Trial] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    from dpbench.cli import config_dir
    from dpbench.config import register_schemas

    register_schemas()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _train_steps(overrides: list[str], batch_size: int, steps: int, cap_mb: float, queue) -> None:
    """Child process: build the run's model and strategy, then train `steps` steps on a batch of exactly B."""
    try:
        from dpbench.config import Config, validated
        from dpbench.data import load_data
        from dpbench.models import build_model
        from dpbench.privatizers import PrivacySettings, make_strategy
        from dpbench.privatizers.base import StepContext
        from dpbench.profiling.memory import PeakMemory

        cfg = _compose(overrides)
        typed: Config = validated(Config, cfg, "top-level")
        device = torch.device("cuda" if torch.cuda.is_available() and typed.trainer.accelerator != "cpu" else "cpu")
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
        memory = PeakMemory(device)
        memory.start()
        for step in range(steps):
            optimizer.zero_grad(set_to_none=True)
            strategy.privatize(model, data.task, batch, StepContext(step, float(batch_size)))
            strategy.apply_update(optimizer)
        memory.stop()
        queue.put(("ok", memory.peak_mb))
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


def run_trial(overrides: list[str], batch_size: int, cap_mb: float, steps: int = 2) -> Trial:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_train_steps, args=(overrides, batch_size, steps, cap_mb, queue))
    process.start()
    peak_rss = 0.0
    while process.is_alive():
        peak_rss = max(peak_rss, _resident_mb(process.pid))
        if not torch.cuda.is_available() and peak_rss > cap_mb:
            process.kill()
            process.join()
            return Trial(batch_size, False, peak_rss, f"resident memory passed the {cap_mb:g} MB cap")
        if not queue.empty():
            break
        time.sleep(RSS_POLL_S)
    status, payload = queue.get()
    process.join()
    if status == "ok":
        return Trial(batch_size, True, payload)
    if status == "oom":
        return Trial(batch_size, False, None, payload)
    raise RuntimeError(f"trial at batch size {batch_size} failed:\n{payload}")


def find_max_batch(
    overrides: list[str], cap_mb: float, start: int = 8, limit: int = 1 << 16, resolution: float = 0.05,
) -> MaxBatchResult:
    """Double from `start` until a trial fails, then bisect to within `resolution` (relative)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    result = MaxBatchResult(list(overrides), cap_mb, device, 0)

    def fits(batch_size: int) -> bool:
        trial = run_trial(overrides, batch_size, cap_mb)
        result.trials.append(trial)
        print(f"  batch {batch_size:>6}: {'fits' if trial.fits else 'fails'} "
              f"(peak {trial.peak_memory_mb or 0:.0f} MB) {trial.reason}", flush=True)
        return trial.fits

    if not fits(start):
        return result
    low, high = start, None
    while high is None and low < limit:
        candidate = min(low * 2, limit)
        if fits(candidate):
            low = candidate
        else:
            high = candidate
    while high is not None and high - low > max(1, int(low * resolution)):
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    result.max_batch_size = low
    return result
