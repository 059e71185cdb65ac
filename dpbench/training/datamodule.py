"""Loaders: Poisson (or shuffled) training batches, sequential evaluation batches."""

from __future__ import annotations

import lightning as L
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from dpbench.core.errors import ConfigurationError
from dpbench.data import DataBundle, identity_collate
from dpbench.privacy.randomness import PrivacyRandomness
from dpbench.privacy.sampling import PoissonBatchSampler, ShuffledBatchSampler


class DPDataModule(L.LightningDataModule):
    """Training batches are drawn from the run's secret randomness, keyed by the trainer's logical step."""

    def __init__(
        self, data: DataBundle, batch_size: int, sampling: str, randomness: PrivacyRandomness, eval_batch_size: int
    ):
        super().__init__()
        self.data = data
        self.batch_size = batch_size
        self.sampling = sampling
        self.randomness = randomness
        self.eval_batch_size = eval_batch_size

    @property
    def sampling_rate(self) -> float:
        return self.batch_size / len(self.data.train)

    def _finished_steps(self) -> int:
        """Logical steps done so far (optimizer steps, restored from a checkpoint on resume)."""
        return self.trainer.global_step if self.trainer is not None else 0

    def train_batch_sampler(self) -> PoissonBatchSampler | ShuffledBatchSampler:
        rank, world = (self.trainer.global_rank, self.trainer.world_size) if self.trainer is not None else (0, 1)
        if self.sampling == "poisson":
            return PoissonBatchSampler(
                len(self.data.train), self.sampling_rate, self.randomness, rank=rank, world_size=world,
                first_step=self._finished_steps,
            )
        if world > 1:
            raise ConfigurationError("privacy.sampling=shuffle runs on one process only; use poisson under DDP")
        return ShuffledBatchSampler(len(self.data.train), self.batch_size, self.randomness, self._finished_steps)

    @property
    def steps_per_epoch(self) -> int:
        return len(self.train_batch_sampler())

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.data.train, batch_sampler=self.train_batch_sampler(), collate_fn=identity_collate)

    def _eval_loader(self, split) -> DataLoader:
        sampler = BatchSampler(SequentialSampler(split), self.eval_batch_size, drop_last=False)
        return DataLoader(split, batch_sampler=sampler, collate_fn=identity_collate)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader(self.data.validation if self.data.validation is not None else self.data.test)

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader(self.data.test)
