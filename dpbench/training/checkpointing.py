"""Checkpoints during training: every N steps, every M minutes, on SIGINT/SIGTERM, and at the last step.

Every checkpoint is taken at a step boundary (after the optimizer step and the ledger entry), so a resume never
half-replays a step; the file is written atomically, and private to the user, by `AtomicCheckpointIO`.
The checkpoint also holds the global RNG states, so dropout masks replay identically after a resume.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.strategies import ModelParallelStrategy

from dpbench.core.errors import RunInterrupted
from dpbench.training.sharded_checkpoint import save_sharded

log = logging.getLogger(__name__)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
RUN_STATE_KEY = "dpbench_run"
"""Checkpoint entry with what a resume must match: the privacy plan and the public config (and the W&B run id)."""


class StopSignals:
    """For the whole run (training, test, validation) the first SIGINT/SIGTERM only sets `received`: the run stops
    at the next safe point with `RunInterrupted`. A second one acts as if dpbench had installed nothing (Ctrl-C
    twice stops at once)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.getsignal(signum)
                signal.signal(signum, self._on_signal)
        return self

    def claim(self) -> None:
        """Take the signals back from Lightning, which wraps them at fit start and would end the run with exit
        code 0 at the epoch's end, possibly before the checkpoint of the step in flight."""
        for signum in self._previous:
            signal.signal(signum, self._on_signal)

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
            return
        previous = self._previous.get(signum)
        if callable(previous):
            previous(signum, frame)
            return
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def stop_if_received(self, step: int, checkpoint: Path | None) -> None:
        if self.received is not None:
            raise RunInterrupted(self.received, step, checkpoint)


def _rng_states() -> dict[str, Any]:
    """Tensors and plain values only: checkpoints are read with torch's weights-only unpickler and nothing else
    (checkpoint_io.load_checkpoint)."""
    name, keys, position, has_gauss, cached_gauss = np.random.get_state()
    numpy_state = [name, torch.from_numpy(keys.copy()), position, has_gauss, cached_gauss]
    states = {"torch": torch.get_rng_state(), "numpy": numpy_state, "python": random.getstate()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _restore_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    name, keys, position, has_gauss, cached_gauss = states["numpy"]
    np.random.set_state((name, keys.numpy(), position, has_gauss, cached_gauss))
    random.setstate(states["python"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


class PeriodicCheckpoint(L.Callback):
    """Writes `path` at a cadence, on a stop signal and at the last step; `extra` goes into every checkpoint."""

    def __init__(
        self, path: Path, every_n_steps: int | None, every_minutes: float | None, signals: StopSignals,
        extra: dict[str, Any] | None = None,
    ):
        self.path = Path(path)
        self.every_n_steps = every_n_steps
        self.every_seconds = every_minutes * 60.0 if every_minutes else None
        self.signals = signals
        self.extra = extra or {}
        self.save_seconds: list[float] = []
        self._last_save = time.monotonic()
        self._stop: int | None = None
        self._carried_over: int | None = None
        """The step whose due checkpoint moved to the next one (an epoch's last step), or None."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_save = time.monotonic()
        self.signals.claim()

    def _due(self, step: int) -> bool:
        by_steps = self.every_n_steps is not None and step % self.every_n_steps == 0
        by_time = self.every_seconds is not None and time.monotonic() - self._last_save >= self.every_seconds
        return by_steps or by_time

    @staticmethod
    def _final_step(trainer: L.Trainer) -> bool:
        if 0 < trainer.max_steps <= trainer.global_step:
            return True
        last_epoch = trainer.max_epochs is not None and 0 < trainer.max_epochs <= trainer.current_epoch + 1
        return last_epoch and trainer.fit_loop.epoch_loop.batch_progress.is_last_batch

    def save(self, trainer: L.Trainer, moved_from: int | None = None) -> None:
        started = time.perf_counter()
        for logger in trainer.loggers:  # the history on disk reaches at least as far as the checkpoint
            logger.save()
        if isinstance(trainer.strategy, ModelParallelStrategy):
            save_sharded(trainer, self.path)
        else:
            trainer.save_checkpoint(self.path, weights_only=False)  # the full state, not only the weights
        self.save_seconds.append(time.perf_counter() - started)
        self._last_save = time.monotonic()
        moved = (f" (due at step {moved_from}, an epoch's last step, which Lightning would resume without its "
                 "evaluation)" if moved_from is not None else "")
        log.info("checkpoint at step %d%s: %s", trainer.global_step, moved, self.path)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        """A checkpoint due at an epoch's last step moves to the next step: Lightning resumes a checkpoint taken
        there without that epoch's evaluation and epsilon entry. The run's last step is checkpointed where it is."""
        stop = trainer.strategy.broadcast(self.signals.received)  # ranks agree at this step boundary
        due = stop is not None or self._carried_over is not None or self._due(trainer.global_step)
        if not self._final_step(trainer):
            if not trainer.strategy.broadcast(due):
                return
            if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
                self._carried_over = trainer.global_step
                return
        moved_from, self._carried_over = self._carried_over, None
        self.save(trainer, moved_from)
        self._stop = stop  # stop only once the step it stops at is checkpointed

    def _stop_if_signalled(self, trainer: L.Trainer) -> None:
        """Raised at the next step's start, once the checkpointed step has logged its metrics."""
        if self._stop is not None:
            for logger in trainer.loggers:
                logger.save()
            raise RunInterrupted(self._stop, trainer.global_step, self.path)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self._stop_if_signalled(trainer)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop_if_signalled(trainer)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        log_step = trainer.fit_loop.epoch_loop._batches_that_stepped + 1  # where Lightning resumes logging
        checkpoint[RUN_STATE_KEY] = {
            **self.extra, "step": trainer.global_step, "log_step": log_step, "rng": _rng_states(),
        }

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        _restore_rng_states(checkpoint[RUN_STATE_KEY]["rng"])
