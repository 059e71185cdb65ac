"""Largest batch size a configuration trains at under a memory cap: doubling, then bisection.

Every trial runs a few optimizer steps in a fresh `spawn` process, so peaks never carry over between trials.
CPU: the parent polls the child's resident memory and kills it above the cap (a cap on resident memory, enforced
per trial process), and the child's data segment is limited (RLIMIT_DATA) a little above the cap, so that a trial
that outruns the poll fails its allocation instead of taking the machine down. CUDA: the child caps the caching
allocator with set_per_process_memory_fraction, so an allocation past the cap raises out-of-memory, and builds the
model on the device. A cap that the process passes before its first step (Python, torch, data and model) is refused
with the footprint it would need, rather than answered with "max batch 0".
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import resource
import signal
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from queue import Empty

import torch

from dpbench.app.hydra_setup import compose
from dpbench.core.errors import ConfigurationError
from dpbench.profiling.memory import available_mb, data_segment_mb
from dpbench.profiling.working_set import PeakInUse, in_use_bytes

log = logging.getLogger(__name__)

RSS_POLL_S = 0.01
DATA_LIMIT_HEADROOM = 1.1, 512.0
"""CPU trials: RLIMIT_DATA = guard * 1.1 + 512 MB (the data segment holds reserved, not yet resident, memory too)."""
RESIDENT_GUARD = 1.5
"""A CPU cap limits the trial's working set (malloc's bytes in use at their peak); its resident size, which also
holds what the allocator keeps of freed memory and the libraries' pages, is stopped only past this multiple of the
cap above the interpreter's own resident size: a guard for the machine, not the measure."""
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
    "process_peak_mb": "the trial process's whole peak, read by the child at the end of its steps (CPU: VmHWM, "
                       "Python and torch included; CUDA: max_memory_reserved): what the frontier plots",
    "interpreter_rss_mb": "VmRSS of the trial process after importing Python, torch and dpbench, before data or model: "
                          "the part of a CPU peak no method can save",
    "working_set_mb": "CPU: the bytes malloc held in use at their peak over the trial's first step, the whole "
                      "process's (interpreter, data, model and the step): what a CPU cap is compared with "
                      "(dpbench/profiling/working_set.py)",
    "interpreter_in_use_mb": "CPU: malloc's bytes in use after the imports: the part of working_set_mb no method "
                             "can save",
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
    process_peak_mb: float | None = None
    interpreter_rss_mb: float | None = None
    parameters: int | None = None
    """The model's parameter count (null when the trial stopped before it was built)."""
    setup_s: float | None = None
    """Seconds from the trial's start until its first step (interpreter, data, model): what a search pays per trial."""
    samples_per_s: float | None = None
    """Batch size over the median time of the steps after the first (a warm-up): the steady step, which the rare
    steps that re-check per-sample gradients (at most 2% of a run's time) do not move; null with fewer than two."""
    working_set_mb: float | None = None
    interpreter_in_use_mb: float | None = None
    """CPU: malloc's bytes in use after the imports, before data or model: the part of working_set_mb no method
    can save."""

    @property
    def peak_mb(self) -> float | None:
        """The trial's peak as the frontier reports it: the working set on CPU where it was read, else the process
        peak (VmHWM; CUDA max_memory_reserved)."""
        return self.working_set_mb if self.working_set_mb is not None else self.process_peak_mb


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
    return (f"the trial process's working set (malloc's bytes in use at their peak over its first step); its resident "
            f"memory (VmRSS), polled by the parent, is stopped past {RESIDENT_GUARD:g}x the cap above the "
            "interpreter's")


def trial_device(overrides: list[str]) -> str:
    """The device a trial trains on, decided once in the parent: it enforces a CPU cap itself, the child a CUDA one."""
    accelerator = compose(overrides).trainer.accelerator
    return "cuda" if torch.cuda.is_available() and accelerator != "cpu" else "cpu"


def _limit_data_segment(cap_mb: float) -> None:
    if math.isfinite(cap_mb):
        scale, extra_mb = DATA_LIMIT_HEADROOM
        limit = int((cap_mb * scale + extra_mb) * 2**20)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def _out_of_memory(error: Exception) -> bool:
    """torch.OutOfMemoryError on CUDA; on CPU a failed allocation (RLIMIT_DATA) is a RuntimeError or MemoryError."""
    return isinstance(error, torch.OutOfMemoryError | MemoryError) or "can't allocate memory" in str(error)


def _train_steps(overrides: list[str], batch_size: int, steps: int, cap_mb: float, device_name: str, queue) -> None:
    """Child process: build the run's model and strategy, then train `steps` steps on a batch of exactly B."""
    try:
        from dpbench.core.config import MIXED_PRECISION, Config, validated
        from dpbench.data import load_data
        from dpbench.models import build_model
        from dpbench.privacy.accountant import PrivacyAccountant
        from dpbench.privatizers import PrivacySettings, check_strategy_precision, make_strategy
        from dpbench.privatizers.base import StepContext
        from dpbench.profiling.memory import PeakMemory, high_water_mark_mb, resident_mb
        from dpbench.training.step import privatizing

        queue.put(("interpreter", resident_mb(), (in_use_bytes() or 0) / 2**20))
        cfg = compose(overrides)
        typed: Config = validated(Config, cfg, "top-level")
        device = torch.device(device_name)
        if device.type == "cuda":
            total = torch.cuda.get_device_properties(device).total_memory / 2**20
            index = device.index if device.index is not None else torch.cuda.current_device()
            torch.cuda.set_per_process_memory_fraction(min(1.0, cap_mb / total), index)
        else:  # the guard's room above what the imports already mapped
            _limit_data_segment(cap_mb * RESIDENT_GUARD + (data_segment_mb() or 0.0))
        data = load_data(cfg.data)
        with device:  # a billion-parameter model is initialized where it trains, not on the host first
            model = build_model(cfg.model, data)
        sigma = typed.privacy.noise_multiplier or 1.0
        settings = PrivacySettings(typed.privacy.clip_norm, min(1.0, batch_size / len(data.train)), sigma)
        strategy = make_strategy(cfg.privatizer, settings)
        check_strategy_precision(strategy, str(typed.trainer.precision))
        strategy.attach(model)
        planned = typed.max_steps or typed.epochs * math.ceil(len(data.train) / batch_size)
        # what the run fixes before its first step besides sigma (sparse's selection budget, D2P2's noise schedule)
        strategy.prepare(model, planned, typed.privacy.delta, typed.privacy.epsilon, PrivacyAccountant())
        optimizer = strategy.configure_optimizer(model, typed.optimizer)
        index = torch.arange(batch_size) % len(data.train)
        inputs, targets = data.train.__getitems__(index.tolist())
        batch = (inputs.to(device) if torch.is_tensor(inputs) else {k: v.to(device) for k, v in inputs.items()},
                 targets.to(device))
        queue.put(("ready", resident_mb(), sum(p.numel() for p in model.parameters())))
        memory = PeakMemory(device)
        memory.start()
        reading = PeakInUse() if device.type == "cpu" and in_use_bytes() is not None else None

        mixed = str(typed.trainer.precision) == MIXED_PRECISION

        def step_once(step: int) -> float:
            started = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=mixed), privatizing(strategy, model):
                strategy.privatize(model, data.task, batch, StepContext(step, float(batch_size)))
                strategy.apply_update(optimizer)
            _synchronize(device)
            return time.perf_counter() - started

        step_seconds, working_set = _timed_and_read(step_once, steps, reading)
        timed = step_seconds[max(1, 2 if working_set is not None else 0):]  # after the warm-up and the read steps
        rate = batch_size / statistics.median(timed) if timed else None
        memory.stop()
        process_peak = memory.max_memory_reserved_mb if device.type == "cuda" else high_water_mark_mb()
        queue.put(("ok", {"steps_peak_mb": memory.peak_mb, "steps_peak_method": memory.method,
                          "process_peak_mb": process_peak, "samples_per_s": rate, "working_set_mb": working_set}))
    except ConfigurationError as error:  # a setting the method refuses: the parent says so, in one line
        queue.put(("refused", str(error)))
    except Exception as error:
        if _out_of_memory(error):
            queue.put(("oom", str(error).splitlines()[0] if str(error) else repr(error)))
        else:
            queue.put(("error", traceback.format_exc()))


def _timed_and_read(step_once: Callable[[int], float], steps: int, reading: PeakInUse | None
                    ) -> tuple[list[float], float | None]:
    """Each step's seconds, and the working set (MB) read over the first two steps (the optimizer's state is made in
    the first): those are slowed by the reads, so the rate leaves them out."""
    read = min(2, steps) if reading is not None else 0
    seconds = []
    if reading is not None and read:
        with reading:
            seconds += [step_once(step) for step in range(read)]
    seconds += [step_once(step) for step in range(read, steps)]
    return seconds, reading.peak / 2**20 if reading is not None and read else None


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
    started = time.perf_counter()
    process.start()
    peak_rss, setup_rss, interpreter_rss, setup_s, parameters, outcome = 0.0, None, None, None, None, None
    interpreter_in_use = None
    while outcome is None:
        try:
            message = queue.get(timeout=RSS_POLL_S) if process.is_alive() else queue.get(timeout=5)
        except Empty:
            if not process.is_alive():
                process.join()
                if process.exitcode == -signal.SIGKILL:  # the kernel's OOM killer: the host ran out before the cap
                    stage = "setup" if setup_rss is None else "steps"
                    return Trial(batch_size, False, peak_rss, setup_rss, stage=stage,
                                 reason=f"killed by the system at {peak_rss:.0f} MB resident (the host ran out of "
                                        f"memory before the {cap_mb:g} MB cap)", interpreter_rss_mb=interpreter_rss,
                                 parameters=parameters)
                raise RuntimeError(f"trial at batch size {batch_size} died (exit code {process.exitcode})") from None
            message = None
        if message is not None and message[0] == "interpreter":
            interpreter_rss = message[1]
            interpreter_in_use = message[2] if len(message) > 2 else None
        elif message is not None and message[0] == "ready":
            setup_rss, parameters, setup_s = message[1], message[2], time.perf_counter() - started
        elif message is not None:
            outcome = message
        peak_rss = max(peak_rss, _resident_mb(process.pid))
        guarded = device == "cpu" and interpreter_rss is not None  # the imports are not the method: not guarded
        if outcome is None and guarded and peak_rss > cap_mb * RESIDENT_GUARD + interpreter_rss:
            process.kill()
            process.join()
            return Trial(batch_size, False, peak_rss, setup_rss, stage="setup" if setup_rss is None else "steps",
                         reason=f"resident memory passed {RESIDENT_GUARD:g}x the {cap_mb:g} MB cap above the "
                                f"interpreter's own", interpreter_rss_mb=interpreter_rss)
    process.join()
    stage = "setup" if setup_rss is None else "steps"
    if outcome[0] == "ok":
        trial = Trial(batch_size, True, peak_rss, setup_rss, interpreter_rss_mb=interpreter_rss, setup_s=setup_s,
                      parameters=parameters, interpreter_in_use_mb=interpreter_in_use, **outcome[1])
        if device == "cpu" and trial.working_set_mb is not None and trial.working_set_mb > cap_mb:
            trial.fits, trial.stage = False, "steps"
            trial.reason = f"working set {trial.working_set_mb:.0f} MB passed the {cap_mb:g} MB cap"
        return trial
    if outcome[0] == "oom":
        return Trial(batch_size, False, peak_rss, setup_rss, stage=stage, reason=outcome[1],
                     interpreter_rss_mb=interpreter_rss, parameters=parameters)
    if outcome[0] == "refused":
        raise ConfigurationError(outcome[1])
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


def most_trials(start: int, limit: int, resolution: float) -> int:
    """An upper bound on a search's trials: doublings from `start` to `limit`, then bisection to `resolution`."""
    doublings = max(0, math.ceil(math.log2(max(limit, start) / start))) + 1
    bisections = math.ceil(math.log2(1 / resolution)) if resolution > 0 else math.ceil(math.log2(max(limit, 2)))
    return doublings + max(1, bisections) + 1


def find_max_batch(
    overrides: list[str], cap_mb: float, start: int = 8, limit: int = 1 << 16, resolution: float = 0.05,
    steps: int = 2, model_may_not_fit: bool = False, on_trial: Callable[[MaxBatchResult], None] | None = None,
    run: Callable[[list[str], int, float, int, str], Trial] | None = None,
) -> MaxBatchResult:
    """Double from `start` until a trial fails, then bisect to within `resolution` (relative); below `start` when
    even it fails. Raises ConfigurationError when the cap is below what the process needs before any step, unless
    `model_may_not_fit` (the frontier) and the cap is above the interpreter's own footprint: then a model that does
    not fit before its first step is out of memory at batch 1, which the result says. `run` (overrides, batch,
    cap, steps, device) -> Trial replaces the one-process trial (the frontier's sharded runs)."""
    device = trial_device(overrides)
    result = MaxBatchResult(list(overrides), cap_mb, device, 0, cap_applies_to(device))
    available = available_mb()
    if device == "cpu" and available is not None and cap_mb > available:
        log.warning("the %g MB cap is above the %.0f MB this machine has available: a trial may be killed by the "
                    "system before it reaches the cap (recorded as such)", cap_mb, available)

    def fits(batch_size: int) -> bool:
        trial = (run or _one_process_trial)(overrides, batch_size, cap_mb, steps, device)
        result.trials.append(trial)
        measured = f", peak {trial.process_peak_mb:.0f} MB" if trial.process_peak_mb is not None else ""
        if trial.working_set_mb is not None:
            measured += f", working set {trial.working_set_mb:.0f} MB"
        rate = f", {trial.samples_per_s:.1f} samples/s" if trial.samples_per_s is not None else ""
        setup = f", setup {trial.setup_s:.0f} s" if trial.setup_s is not None else ""
        print(f"  trial {len(result.trials)} (of at most {bound}) batch {batch_size:>6}: "
              f"{'fits' if trial.fits else 'fails'} (polled resident {trial.process_peak_rss_mb or 0:.0f} MB"
              f"{measured}{rate}{setup}) {trial.reason}", flush=True)
        if on_trial is not None:
            on_trial(result)
        return trial.fits

    bound = most_trials(start, limit, resolution)

    if fits(start):
        low, high = start, None
        while high is None and low < limit:
            candidate = min(low * 2, limit)
            if fits(candidate):
                low = candidate
            else:
                high = candidate
    elif result.trials[-1].stage == "setup" and not (model_may_not_fit and _above_interpreter(result.trials[-1],
                                                                                              cap_mb, device)):
        raise footprint_error(overrides, start, cap_mb, result.trials[-1], device)
    elif result.trials[-1].stage == "setup":  # the model itself does not fit: batch 1 settles it
        low, high = (1, start) if start > 1 and fits(1) else (0, None)
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
        result.note = f"out of memory at batch 1 under {cap_mb:g} MB ({result.trials[-1].reason})"
    return result


def _one_process_trial(overrides: list[str], batch_size: int, cap_mb: float, steps: int, device: str) -> Trial:
    return run_trial(overrides, batch_size, cap_mb, steps=steps, device=device)


def _above_interpreter(trial: Trial, cap_mb: float, device: str) -> bool:
    """A CUDA cap never holds the interpreter; a CPU cap must clear what Python, torch and dpbench need alone."""
    return device == "cuda" or (trial.interpreter_rss_mb is not None and trial.interpreter_rss_mb < cap_mb)
