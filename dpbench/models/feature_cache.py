"""Features of a model's fixed first stage (a scattering transform, a frozen pretrained encoder), computed once per
data split and cached on disk.

The stage has no trained parameter and maps each record to its own features, so training on the features has the
privacy guarantee of training on the records. One file per split, keyed by the split's exact contents and a
description of the stage (its settings and whatever fixes its weights), so that a changed data set or setting
recomputes and nothing stale is ever read; written atomically and 0600: features of training data are as private as
the data.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

log = logging.getLogger(__name__)

Inputs = Tensor | dict[str, Tensor]


def default_cache_dir(kind: str) -> Path:
    """$XDG_CACHE_HOME/dpbench/KIND, or ~/.cache/dpbench/KIND."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "dpbench" / kind


def _named_tensors(inputs: Inputs) -> list[tuple[str, Tensor]]:
    return sorted(inputs.items()) if isinstance(inputs, dict) else [("", inputs)]


def tensor_bytes(tensor: Tensor) -> bytes:
    """The tensor's values as bytes, whatever its dtype (bfloat16 included)."""
    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def cache_key(inputs: Inputs, stage: str) -> str:
    """A digest of the stage's description and of every input tensor's name, shape, dtype and bytes."""
    digest = hashlib.sha256(stage.encode())
    for name, tensor in _named_tensors(inputs):
        digest.update(repr((name, tuple(tensor.shape), str(tensor.dtype))).encode())
        digest.update(tensor_bytes(tensor))
    return digest.hexdigest()[:32]


def cached(inputs: Inputs, stage: str, compute: Callable[[Inputs], Tensor], shape: tuple[int, ...], cache_dir: Path,
           what: str) -> Tensor:
    """compute(inputs), a (N, *shape) tensor, read from cache_dir when a file for these exact inputs and this stage
    is there, else computed and written; `what` names the features in the log."""
    count = len(_named_tensors(inputs)[0][1])
    path = cache_dir / f"{cache_key(inputs, stage)}.pt"
    expected = (count, *shape)
    if path.exists():
        try:
            features = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # torn or foreign file: recompute and replace it
            log.warning("%s cache %s unreadable (%s): recomputing", what, path, error)
        else:
            if isinstance(features, Tensor) and tuple(features.shape) == expected:
                log.info("%s of %d records read from %s", what, count, path)
                return features
            log.warning("%s cache %s holds another shape: recomputing", what, path)
    started = time.perf_counter()
    features = compute(inputs)
    cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    handle, temporary = tempfile.mkstemp(dir=cache_dir, suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            torch.save(features, file)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    log.info("%s of %d records computed in %.0f s, cached in %s", what, count, time.perf_counter() - started, path)
    return features
