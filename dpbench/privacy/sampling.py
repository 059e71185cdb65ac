"""Batch samplers: Poisson sampling (the accountant's assumption) and shuffled fixed-size batches.

Both are indexed by the logical step, not by an epoch counter that someone must remember to advance: iterating
asks `first_step()` (the training loop's count of finished steps) where the epoch starts, and step t's batch is
drawn from the secret key (sampling, t, rank). Every step therefore gets a fresh draw across epochs, resumes and
ranks, and re-iterating at the same step (a restart) redraws the same batch rather than a new one, so a retried
step is never a second, unaccounted release.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch.utils.data import Sampler

from dpbench.privacy.randomness import PrivacyRandomness


def _starts_at_zero() -> int:
    return 0


class PoissonBatchSampler(Sampler[list[int]]):
    """Each sample joins each batch independently with probability q; batches may be empty.

    An epoch has round(1/q) steps, so the expected number of samples per epoch is the data set size. Under data
    parallelism rank r samples only indices r, r + W, ...: every sample is still included with probability q, once.
    """

    def __init__(
        self, num_samples: int, sampling_rate: float, randomness: PrivacyRandomness,
        steps_per_epoch: int | None = None, rank: int = 0, world_size: int = 1,
        first_step: Callable[[], int] = _starts_at_zero,
    ):
        if num_samples <= 0:
            raise ValueError("Poisson sampling needs a non-empty data set")
        if not 0.0 < sampling_rate <= 1.0:
            raise ValueError(f"sampling rate must lie in (0, 1], got {sampling_rate}")
        self.num_samples = num_samples
        self.sampling_rate = sampling_rate
        self.randomness = randomness
        self.steps_per_epoch = steps_per_epoch or max(1, round(1.0 / sampling_rate))
        self.rank = rank
        self.shard = torch.arange(rank, num_samples, world_size)
        self.first_step = first_step

    def __len__(self) -> int:
        return self.steps_per_epoch

    def batch(self, step: int) -> list[int]:
        """The batch of logical step `step` (this rank's part)."""
        uniforms = self.randomness.draws("sampling", step, self.rank).uniform(len(self.shard))
        return self.shard[uniforms < self.sampling_rate].tolist()

    def __iter__(self) -> Iterator[list[int]]:
        start = self.first_step()
        for step in range(start, start + self.steps_per_epoch):
            yield self.batch(step)


class ShuffledBatchSampler(Sampler[list[int]]):
    """Fixed-size batches of a fresh permutation each epoch (last partial batch dropped).

    Not what the Poisson accountant assumes: runs that use it say so in results.json.
    """

    def __init__(
        self, num_samples: int, batch_size: int, randomness: PrivacyRandomness,
        first_step: Callable[[], int] = _starts_at_zero,
    ):
        if num_samples < batch_size:
            raise ValueError(f"batch size {batch_size} exceeds the data set size {num_samples}")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.randomness = randomness
        self.first_step = first_step

    def __len__(self) -> int:
        return self.num_samples // self.batch_size

    def __iter__(self) -> Iterator[list[int]]:
        """The permutation is keyed by the epoch's first step; a resume mid-epoch skips the batches already used."""
        start = self.first_step()
        offset = start % len(self)
        order = self.randomness.draws("shuffle", start - offset).permutation(self.num_samples).tolist()
        for index in range(offset, len(self)):
            yield order[index * self.batch_size : (index + 1) * self.batch_size]
