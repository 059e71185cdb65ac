"""Pick, per layer shape, the fastest of several exact rules by timing them once on the real tensors, and keep the
choice on disk so that every later run on the machine makes the same one.

Which rule is cheapest depends on the layer, the batch, the device and the thread count, and no formula predicted it
well enough: the TF-Privacy CNN's first convolution is 2.3x faster with the grouped rule at batch 2,048 (a tie at
256), while its second is 1.7x slower with it at 2,048 and 1.8x faster at 256 (dpbench 2026-11-26, one CPU thread,
norms and clipped sum included). Every candidate gives the same per-sample gradients up to rounding, so the choice
never changes what is clipped; but rounding differs between rules, and a run must give the same numbers when it is
run again or resumed. So a choice is made once per machine and shape key (batch sizes grouped by powers of two, so
Poisson batches share it), written to $XDG_CACHE_HOME/dpbench/rule_choices/ (like an autotuner's cache), and read
by every later process; the first candidate is kept unless another beats it by MARGIN, so near ties do not depend
on the timing's noise.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # not on Windows: concurrent first runs may then record different choices
    fcntl = None

import torch

from dpbench.models.feature_cache import default_cache_dir

TIMED_RUNS = 2
"""Timed runs per candidate after one untimed warm-up run; the faster of them counts."""
MARGIN = 0.2
"""Another candidate replaces the first only when it takes at most 1 - MARGIN of the first's time."""
FILE = "choices.json"

_choices: dict[str, str] = {}


def batch_bucket(batch: int) -> int:
    """The power of two at or above `batch`: Poisson batch sizes around the expected one share a choice."""
    return 1 << max(batch - 1, 0).bit_length()


@functools.cache
def _machine(device: torch.device) -> str:
    """Once per device: every convolution of every step asks."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    return f"{platform.machine()} {platform.processor() or platform.node()}, {os.cpu_count()} cores, torch " \
           f"{torch.__version__}"


def _path() -> Path:
    return default_cache_dir("rule_choices") / FILE


def _recorded() -> dict[str, str]:
    try:
        recorded = json.loads(_path().read_text())
    except (OSError, ValueError):
        return {}
    return recorded if isinstance(recorded, dict) else {}


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """An exclusive lock on the choices file's directory, where the platform has flock."""
    path = _path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(path.parent / "lock", "w") as handle:
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _record(key: str, name: str) -> str:
    """The choice recorded for `key`: one another process recorded first, else `name`, added to the file
    (atomically, under the lock: concurrent runs that timed the same key all keep the first choice written)."""
    with _locked():
        recorded = _recorded()
        if key in recorded:
            return recorded[key]
        path = _path()
        handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        try:
            with os.fdopen(handle, "w") as file:
                json.dump({**recorded, key: name}, file, indent=1, sort_keys=True)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    return name


def _seconds(run: Callable[[], object], device: torch.device) -> float:
    best = float("inf")
    for attempt in range(TIMED_RUNS + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if attempt:
            best = min(best, time.perf_counter() - started)
    return best


def fastest(key: Hashable, candidates: dict[str, Callable[[], object]], device: torch.device) -> str:
    """The candidate chosen for `key` on this machine: recorded, else timed now (each candidate runs its whole rule,
    the per-sample norms and the clipped sum included, TIMED_RUNS + 1 times) and recorded. A single candidate is
    neither timed nor recorded."""
    if len(candidates) == 1:
        return next(iter(candidates))
    text = repr((_machine(device), key))
    if text not in _choices:
        recorded = _recorded().get(text)
        if recorded in candidates:
            _choices[text] = recorded
        else:
            with torch.no_grad():
                timings = {name: _seconds(run, device) for name, run in candidates.items()}
            first, *_ = timings
            best = min(timings, key=timings.__getitem__)
            _choices[text] = _record(text, best if timings[best] <= (1 - MARGIN) * timings[first] else first)
    return _choices[text]


def chosen() -> dict[str, str]:
    """The choices this process has used (for benchmarks and tests)."""
    return dict(_choices)


def forget() -> None:
    """Drop this process's choices (the file stays; tests point XDG_CACHE_HOME elsewhere)."""
    _choices.clear()
