"""Checkpoints written to a temporary file and renamed: a kill mid-write never leaves a torn last.ckpt."""

from __future__ import annotations

import os
from typing import Any

from lightning.pytorch.plugins.io import TorchCheckpointIO


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        tmp = f"{path}.tmp"
        super().save_checkpoint(checkpoint, tmp, storage_options)
        os.replace(tmp, path)
