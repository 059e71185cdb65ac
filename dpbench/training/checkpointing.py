"""Checkpoints during training: every N steps, every M minutes, on SIGINT/SIGTERM, and at the last step.

Every checkpoint is taken at a step boundary (after the optimizer step and the ledger entry), so a resume never
half-replays a step; the file is written atomically by `AtomicCheckpointIO`. A signal only raises a flag: the
step in flight finishes, the checkpoint is written, the step's metrics are logged, then the run stops with
`RunInterrupted` before the next step. A second signal of the
same kind acts as if dpbench had installed nothing (Ctrl-C twice kills at once).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L

from dpbench.errors import RunInterrupted

log = logging.getLogger(__name__)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
RUN_STATE_KEY = "dpbench_run"
"""Checkpoint entry with what a resume must match: the privacy plan and the public config (and the W&B run id)."""


class PeriodicCheckpoint(L.Callback):
    """Writes `path` at a cadence, on a stop signal and when training ends; `extra` goes into every checkpoint."""

    def __init__(
        self, path: Path, every_n_steps: int | None, every_minutes: float | None, extra: dict[str, Any] | None = None,
    ):
        self.path = Path(path)
        self.every_n_steps = every_n_steps
        self.every_seconds = every_minutes * 60.0 if every_minutes else None
        self.extra = extra or {}
        self.save_seconds: list[float] = []
        self._last_save = time.monotonic()
        self._signal: int | None = None
        self._stop: int | None = None
        self._previous_handlers: dict[int, Any] = {}

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signal = signum
        signal.signal(signum, self._previous_handlers.get(signum, signal.SIG_DFL))

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_save = time.monotonic()
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in STOP_SIGNALS:
            self._previous_handlers[signum] = signal.getsignal(signum)
            signal.signal(signum, self._on_signal)

    def _restore_handlers(self) -> None:
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers.clear()

    def _due(self, step: int) -> bool:
        by_steps = self.every_n_steps is not None and step % self.every_n_steps == 0
        by_time = self.every_seconds is not None and time.monotonic() - self._last_save >= self.every_seconds
        return by_steps or by_time

    def save(self, trainer: L.Trainer) -> None:
        started = time.perf_counter()
        for logger in trainer.loggers:  # the history on disk reaches at least as far as the checkpoint
            logger.save()
        trainer.save_checkpoint(self.path, weights_only=False)
        self.save_seconds.append(time.perf_counter() - started)
        self._last_save = time.monotonic()
        log.info("checkpoint at step %d: %s", trainer.global_step, self.path)

    @staticmethod
    def _final_step(trainer: L.Trainer) -> bool:
        if 0 < trainer.max_steps <= trainer.global_step:
            return True
        last_epoch = trainer.max_epochs is not None and 0 < trainer.max_epochs <= trainer.current_epoch + 1
        return last_epoch and trainer.fit_loop.epoch_loop.batch_progress.is_last_batch

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        """The last step's checkpoint is written here too: Lightning resumes a checkpoint written in on_train_end
        one epoch off (an extended run then trains an epoch too few)."""
        self._stop = trainer.strategy.broadcast(self._signal)  # ranks agree on what to do at this step boundary
        due = self._stop is not None or self._final_step(trainer) or self._due(trainer.global_step)
        if trainer.strategy.broadcast(due):
            self.save(trainer)

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

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore_handlers()
        self._stop_if_signalled(trainer)  # the signal came at the last step: its checkpoint is written

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._restore_handlers()

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        log_step = trainer.fit_loop.epoch_loop._batches_that_stepped + 1  # what Lightning resumes logging at
        checkpoint[RUN_STATE_KEY] = {**self.extra, "step": trainer.global_step, "log_step": log_step}
