"""One progress bar over the whole run with its ETA, on a terminal only.

Lightning's own bars restart every epoch (and read "Epoch 2/-2" when a run is bounded by max_steps), so they say
nothing about when a run of many epochs ends; in a log file or a pipe they are noise.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import lightning as L
from lightning.pytorch.callbacks.progress import ProgressBar
from tqdm import tqdm


def shows_progress(enabled: bool) -> bool:
    """trainer.enable_progress_bar, and stdout is a terminal (no bar in redirected or captured output)."""
    return enabled and sys.stdout.isatty()


class _AboveBar:
    """A console log handler's stream while the bar shows: a record is written above the bar, not into its line."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        tqdm.write(text, file=self.stream, end="")

    def flush(self) -> None:
        self.stream.flush()


class RunProgressBar(ProgressBar):
    """Optimizer steps of the whole run (from the resumed step on a resume) out of trainer.max_steps, with the
    metrics logged with prog_bar=True beside it; log lines printed meanwhile go above the bar."""

    def __init__(self) -> None:
        super().__init__()
        self._enabled = True
        self._bar: tqdm | None = None
        self._consoles: list[tuple[logging.StreamHandler, TextIO]] = []

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not (self._enabled and trainer.is_global_zero):
            return
        for handler in logging.getLogger().handlers:
            if type(handler) is logging.StreamHandler and handler.stream in (sys.stdout, sys.stderr):
                self._consoles.append((handler, handler.stream))
                handler.setStream(_AboveBar(handler.stream))
        self._bar = tqdm(total=trainer.max_steps, initial=trainer.global_step, desc="training", unit="step",
                         file=sys.stdout, dynamic_ncols=True, leave=False)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._bar is not None and trainer.global_step > self._bar.n:
            self._bar.set_postfix_str(self._metrics(trainer, pl_module), refresh=False)
            self._bar.update(trainer.global_step - self._bar.n)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._close()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._close()

    def _metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> str:
        """The logged names' last part (val_on_test/accuracy -> accuracy): the bar keeps its width."""
        metrics = {key.rsplit("/", 1)[-1]: value for key, value in self.get_metrics(trainer, pl_module).items()
                   if key != "v_num"}
        return " ".join(f"{key}={value:.3g}" if isinstance(value, float) else f"{key}={value}"
                        for key, value in metrics.items())

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.refresh()  # the last steps may have come faster than tqdm redraws: the bar ends at its end
            self._bar.close()
            self._bar = None
        for handler, stream in self._consoles:
            handler.setStream(stream)
        self._consoles.clear()
