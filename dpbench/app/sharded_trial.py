"""A frontier trial of a sharded run (`--privatizers vanilla@4`: trainer.strategy=fsdp over 4 ranks): `python -m
dpbench` itself for a few steps at expected batch B, its largest rank's peak from results.json.

Unlike a one-process trial (a batch of exactly B in a process capped as it runs), the ranks Poisson-sample (the batch
varies by step, B on average) and the cap is compared after the run with the largest rank's peak (each rank holds its
own device: that is what must fit one device's memory), so a trial far above the cap may fail by running out of
memory rather than by the comparison; both are recorded as not fitting.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from dpbench.app.max_batch import Trial
from dpbench.core.errors import ConfigurationError

SHARDED_RUN = ["trainer.strategy=fsdp", "trainer.checkpoint=false", "logger.wandb=false", "logger.csv=false",
               "trainer.check_val_every_n_epoch=null", "trainer.enable_progress_bar=false",
               "trainer.memory_check=false", "profiler.warmup_steps=2"]
OUT_OF_MEMORY = ("out of memory", "can't allocate memory", "cannot allocate memory")
REFUSED = 2


def sharded_spec(spec: str) -> tuple[str, int]:
    """'vanilla@4' -> ('vanilla', 4); 'grape' -> ('grape', 1)."""
    name, _, devices = spec.partition("@")
    if not devices:
        return name, 1
    if not devices.isdigit() or int(devices) < 1:
        raise ConfigurationError(f"--privatizers {spec}: the number after @ is the ranks to shard over, e.g. "
                                 f"{name}@4")
    return name, int(devices)


def run_sharded_trial(overrides: list[str], batch_size: int, cap_mb: float, steps: int, devices: int) -> Trial:
    with tempfile.TemporaryDirectory() as directory:
        command = [sys.executable, "-m", "dpbench", *overrides, *SHARDED_RUN, f"trainer.devices={devices}",
                   f"batch_size={batch_size}", f"max_steps={max(steps, 3)}", f"hydra.run.dir={directory}"]
        env = {**os.environ, "WANDB_MODE": "disabled"}
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            return _failed(batch_size, done)
        results = json.loads((Path(directory) / "results.json").read_text())
    peak = _largest_rank_peak(results)
    fits = peak <= cap_mb
    return Trial(batch_size, fits, process_peak_mb=peak, working_set_mb=peak if results["device"] == "cpu" else None,
                 samples_per_s=results.get("samples_per_s"), parameters=results.get("parameters"),
                 stage="" if fits else "steps",
                 reason="" if fits else f"the largest rank's peak {peak:.0f} MB passed the {cap_mb:g} MB cap")


def _largest_rank_peak(results: dict) -> float:
    """The largest rank's whole peak: on CPU its working set above training's start plus what it held then (as a
    one-process trial's working set counts the interpreter, data and model), on CUDA its max_memory_reserved."""
    peaks = results.get("rank_peak_memory_mb") or [results["peak_memory_mb"]]
    starts = results.get("rank_memory_at_start_mb") or [0.0] * len(peaks)
    return max(peak + start for peak, start in zip(peaks, starts, strict=True))


def _failed(batch_size: int, done: subprocess.CompletedProcess) -> Trial:
    last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit code {done.returncode}"
    if done.returncode == REFUSED:
        raise ConfigurationError(last.removeprefix("dpbench: error: "))
    if any(marker in done.stderr.lower() for marker in OUT_OF_MEMORY):
        return Trial(batch_size, False, stage="steps", reason=f"a rank ran out of memory ({last[:200]})")
    raise RuntimeError(f"sharded trial at batch size {batch_size} failed: {last}")
