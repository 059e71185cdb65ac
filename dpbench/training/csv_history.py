"""A CSV logger that keeps a resumed run's history instead of deleting it (Lightning's CSVLogger removes it).

On resume, the rows logged before the checkpoint's step are kept and later ones dropped: the steps after the
checkpoint run again (with the same batches and noise) and log themselves again, so the file reads as one run.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter


class _ContinuedWriter(ExperimentWriter):
    """Touches an existing history only when the resumed run writes its first row, i.e. after the checkpoint was
    restored: a resume refused while restoring leaves the file as it was."""

    def __init__(self, log_dir: str, keep_before_step: int | None):
        self.keep_before_step = keep_before_step
        super().__init__(log_dir)

    def _check_log_dir_exists(self) -> None:
        if self.keep_before_step is None:
            super()._check_log_dir_exists()

    def save(self) -> None:
        if self.metrics and self.keep_before_step is not None:
            self._continue_history()
            self.keep_before_step = None
        super().save()

    def _continue_history(self) -> None:
        path = Path(self.metrics_file_path)
        if not path.is_file():
            return
        with path.open(newline="") as file:
            reader = csv.DictReader(file)
            fieldnames = list(reader.fieldnames or [])
            kept = [row for row in reader if float(row["step"]) < self.keep_before_step]
        tmp = path.with_suffix(".csv.tmp")
        with tmp.open("w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=fieldnames)
            writer.writeheader()
            writer.writerows(kept)
        os.replace(tmp, path)
        self.metrics_keys = fieldnames


class HistoryCSVLogger(CSVLogger):
    """`resume_step`: the logging step the run continues from (None for a new run). Rows are flushed as they are
    logged, so a killed run loses at most the step in flight."""

    def __init__(self, save_dir: str, resume_step: int | None = None):
        super().__init__(save_dir=save_dir, name="csv", version="", flush_logs_every_n_steps=1)
        self.resume_step = resume_step

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _ContinuedWriter(self.log_dir, self.resume_step)
        return self._experiment
