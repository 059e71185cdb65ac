"""Hydra callback: refuse an unwritable run or sweep directory in one line, before Hydra's logging fails on it."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf


def unwritable_reason(directory: Path) -> str | None:
    """Why `directory` cannot hold a run, or None; it is created when missing (Hydra would create it anyway)."""
    probe = directory / f".dpbench-write-test-{os.getpid()}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        return f"{type(error).__name__}: {error.strerror or error}"
    return None


def _check(config: DictConfig, key: str) -> None:
    directory = OmegaConf.select(config, key, throw_on_resolution_failure=False)
    if directory is None:
        return
    reason = unwritable_reason(Path(str(directory)))
    if reason is not None:
        print(f"dpbench: error: cannot write the run directory {directory} ({reason}): choose a writable {key}=...",
              file=sys.stderr)
        sys.exit(2)


class WritableOutputDir(Callback):
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check(config, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check(config, "hydra.sweep.dir")
