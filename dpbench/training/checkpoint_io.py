"""Reading and writing checkpoints: the one place a checkpoint file is opened (design rule 8).

Writing: to a temporary file, flushed to disk and renamed, so a kill or a crash mid-write never leaves a torn
last.ckpt and the rename is durable before the run goes on. A checkpoint holds the run's secret privacy randomness
(the root and the stream positions), so the file is private to the user from its creation (0600, in a 0700
directory), whatever the umask.

Reading: a checkpoint is a pickle, and unpickling a crafted one runs whatever it asks for. Every reader (the resume
check, Lightning's restore inside `fit`, the canary audit) goes through `load_checkpoint`, which admits only torch's
weights-only set (tensors, containers, numbers, strings): what dpbench saves is kept to those types, so that set is
the whole allow-list, and anything else is refused in one line before it can run.
"""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from dpbench.core.errors import ConfigurationError

PRIVATE_FILE, PRIVATE_DIRECTORY = 0o600, 0o700


def _fsync(path: Path, flags: int) -> None:
    descriptor = os.open(path, flags)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _private_directory(directory: Path) -> None:
    """Create `directory` if needed and make it 0700 (also one an older dpbench left 0755)."""
    directory.mkdir(mode=PRIVATE_DIRECTORY, parents=True, exist_ok=True)
    os.chmod(directory, PRIVATE_DIRECTORY)


@contextmanager
def _weights_only_set_alone() -> Iterator[None]:
    """Globals registered with torch.serialization.add_safe_globals (by torch's distributed tensors, or by any library
    or plugin in the process) would widen the allow-list beyond what dpbench saves: they are set aside for the load."""
    registered = torch.serialization.get_safe_globals()
    torch.serialization.clear_safe_globals()
    try:
        yield
    finally:
        torch.serialization.add_safe_globals(registered)


def load_checkpoint(path: str | Path, map_location: Any = "cpu", mmap: bool = False) -> Any:
    """torch.load with `weights_only=True` passed explicitly (so TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD cannot turn it
    off); a file that needs a type outside the allow-list is a ConfigurationError. A torn file raises torch's own
    error, which the caller words."""
    try:
        with _weights_only_set_alone():
            return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as error:
        if not str(error).startswith("Weights only load failed"):
            raise
        named = re.search(r"GLOBAL (\S+)", str(error))
        needs = named.group(1) if named else "a pickle instruction outside torch's weights-only set"
        raise ConfigurationError(
            f"checkpoint {path} refused: it needs {needs}, which no dpbench checkpoint holds, and loading it could "
            "run code (a crafted or foreign file); delete it, or restore the run's own copy, and rerun"
        ) from None


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint IO with dpbench's private atomic write and safe read."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None) -> None:
        path = Path(path)
        _private_directory(path.parent)
        tmp = path.with_name(f"{path.name}.tmp")
        tmp.unlink(missing_ok=True)  # a write that was killed; O_EXCL then never opens a file someone else made
        descriptor = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
        os.fchmod(descriptor, PRIVATE_FILE)  # the umask can only have taken the owner's bits away: give them back
        with os.fdopen(descriptor, "wb") as file:
            torch.save(checkpoint, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
        _fsync(path.parent, os.O_RDONLY)

    def load_checkpoint(
        self, path: str | Path, map_location: Any = "cpu", weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """Lightning's restore in `fit(ckpt_path=...)`: always the safe load, whatever `weights_only` it passes."""
        return load_checkpoint(path, map_location)
