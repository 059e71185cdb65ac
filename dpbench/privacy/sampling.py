"""Batch samplers: Poisson sampling (the accountant's assumption) and shuffled fixed-size batches."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


def _epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """A dedicated generator per (seed, epoch): resumable without saving state, global RNG untouched."""
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)


class PoissonBatchSampler(Sampler[list[int]]):
    """Each sample joins each batch independently with probability q; batches may be empty.

    An epoch has round(1/q) steps, so the expected number of samples per epoch is the data set size. Under data
    parallelism rank r samples only indices r, r + W, ...: every sample is still included with probability q, once.
    """

    def __init__(
        self, num_samples: int, sampling_rate: float, seed: int, steps_per_epoch: int | None = None,
        rank: int = 0, world_size: int = 1,
    ):
        if num_samples <= 0:
            raise ValueError("Poisson sampling needs a non-empty data set")
        if not 0.0 < sampling_rate <= 1.0:
            raise ValueError(f"sampling rate must lie in (0, 1], got {sampling_rate}")
        self.num_samples = num_samples
        self.sampling_rate = sampling_rate
        self.seed = seed
        self.steps_per_epoch = steps_per_epoch or max(1, round(1.0 / sampling_rate))
        self.epoch = 0
        self.rank = rank
        self.shard = torch.arange(rank, num_samples, world_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.steps_per_epoch

    def __iter__(self) -> Iterator[list[int]]:
        generator = _epoch_generator(self.seed + 7919 * self.rank, self.epoch)
        for _ in range(self.steps_per_epoch):
            mask = torch.rand(len(self.shard), generator=generator) < self.sampling_rate
            yield self.shard[mask].tolist()


class ShuffledBatchSampler(Sampler[list[int]]):
    """Fixed-size batches of a fresh permutation each epoch (last partial batch dropped).

    Not what the Poisson accountant assumes: runs that use it say so in results.json.
    """

    def __init__(self, num_samples: int, batch_size: int, seed: int):
        if num_samples < batch_size:
            raise ValueError(f"batch size {batch_size} exceeds the data set size {num_samples}")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_samples // self.batch_size

    def __iter__(self) -> Iterator[list[int]]:
        order = torch.randperm(self.num_samples, generator=_epoch_generator(self.seed, self.epoch)).tolist()
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            yield order[start : start + self.batch_size]
