"""Checkpoints written to a temporary file, flushed to disk and renamed: a kill or a crash mid-write never leaves a
torn last.ckpt, and the rename is durable before the run goes on."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lightning.pytorch.plugins.io import TorchCheckpointIO


def _fsync(path: Path, flags: int) -> None:
    descriptor = os.open(path, flags)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        tmp = Path(f"{path}.tmp")
        super().save_checkpoint(checkpoint, tmp, storage_options)
        _fsync(tmp, os.O_RDONLY)
        os.replace(tmp, path)
        _fsync(Path(path).parent, os.O_RDONLY)
