"""Sharded checkpoints (trainer.strategy=fsdp): Lightning's ModelParallelStrategy writes a directory, each rank's
shards of the model and optimizer (torch.distributed.checkpoint) beside `meta.pt`, rank 0's rest of the checkpoint:
the privacy ledger, the secret randomness, the run state. dpbench writes it the way it writes a single file: into a
temporary directory made owner-only, then swapped in, so that a kill mid-write leaves the previous checkpoint whole
(a kill between the swap's two renames leaves it under `.old`, which the next resume puts back)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import lightning as L

from dpbench.training.checkpoint_io import PRIVATE_DIRECTORY, PRIVATE_FILE

METADATA = "meta.pt"


def sharded_metadata(path: Path) -> Path:
    return Path(path) / METADATA


def _aside(path: Path, suffix: str) -> Path:
    return path.with_name(f"{path.name}.{suffix}")


def _make_private(directory: Path) -> None:
    os.chmod(directory, PRIVATE_DIRECTORY)
    for item in directory.rglob("*"):
        os.chmod(item, PRIVATE_DIRECTORY if item.is_dir() else PRIVATE_FILE)


def save_sharded(trainer: L.Trainer, path: Path) -> None:
    """Every rank writes its shards into `path`.tmp; rank 0 makes it private and swaps it in for `path`."""
    tmp, old = _aside(path, "tmp"), _aside(path, "old")
    if trainer.is_global_zero:
        shutil.rmtree(tmp, ignore_errors=True)
    trainer.strategy.barrier()
    trainer.save_checkpoint(tmp, weights_only=False)
    trainer.strategy.barrier()
    if trainer.is_global_zero:
        _make_private(tmp)
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    trainer.strategy.barrier()


def recover_interrupted_swap(path: Path) -> None:
    """Put back a checkpoint a kill left aside mid-swap (the new one never replaced it)."""
    old = _aside(Path(path), "old")
    if not Path(path).exists() and old.is_dir():
        os.replace(old, path)
