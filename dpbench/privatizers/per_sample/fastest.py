"""Pick, per layer shape, the fastest of several exact rules by timing them once on the real tensors.

Which rule is cheapest depends on the layer, the batch, the device and the thread count, and no formula predicted it
well enough: the TF-Privacy CNN's first convolution is 2.3x faster with the grouped rule at batch 2,048 (a tie at
256), while its second is 1.7x slower with it at 2,048 and 1.8x faster at 256 (dpbench 2026-11-26, one CPU thread,
norms and clipped sum included). Every candidate gives the same per-sample gradients up to rounding, so the choice
changes speed only, never what is clipped; it is made once per shape key (batch sizes grouped by powers of two, so
Poisson batches reuse it) and kept for the process.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

import torch

TIMED_RUNS = 2
"""Timed runs per candidate after one untimed warm-up run; the faster of them counts."""

_choices: dict[Hashable, str] = {}


def batch_bucket(batch: int) -> int:
    """The power of two at or above `batch`: Poisson batch sizes around the expected one share a choice."""
    return 1 << max(batch - 1, 0).bit_length()


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
    """The name of the candidate that ran fastest the first time `key` was seen (each candidate runs its whole rule,
    the per-sample norms and the clipped sum included, TIMED_RUNS + 1 times then); a single candidate is not timed."""
    if len(candidates) == 1:
        return next(iter(candidates))
    if key not in _choices:
        with torch.no_grad():
            timings = {name: _seconds(run, device) for name, run in candidates.items()}
        _choices[key] = min(timings, key=timings.__getitem__)
    return _choices[key]


def chosen() -> dict[Hashable, str]:
    """The choices made so far in this process (for benchmarks and tests)."""
    return dict(_choices)


def forget() -> None:
    """Drop every choice (tests; a benchmark that changes the thread count)."""
    _choices.clear()
