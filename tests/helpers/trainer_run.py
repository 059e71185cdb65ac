"""A real Lightning Trainer over dpbench's data module, module and strategy, on data whose feature is its index:
the batches each logical step trained on are recorded, so privacy properties are checked where they can break."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch
from omegaconf import OmegaConf

from dpbench.core.optim import OptimizerConfig
from dpbench.data import DataBundle, TensorSplit
from dpbench.privacy.ledger import PrivacyLedger
from dpbench.privacy.randomness import PrivacyRandomness
from dpbench.privatizers import PrivacySettings, make_strategy
from dpbench.training.datamodule import DPDataModule
from dpbench.training.module import DPModule


class BatchRecorder(L.Callback):
    """The sample indices of every training batch, in step order."""

    def __init__(self):
        self.batches: list[list[int]] = []

    def on_train_batch_start(self, trainer, pl_module, batch: Any, batch_idx: int) -> None:
        self.batches.append(batch[0][:, 0].long().tolist())


def index_data(size: int) -> DataBundle:
    features = torch.cat([torch.arange(size, dtype=torch.float32)[:, None], torch.randn(size, 3)], dim=1)
    split = TensorSplit(features, torch.randint(0, 2, (size,)))
    return DataBundle("indices", split, TensorSplit(features[:4], split.targets[:4]), num_classes=2)


class IndexModel(torch.nn.Module):
    """Ignores the index column (a feature only the recorder reads)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x[:, 1:])


def fit(
    data: DataBundle, batch_size: int, max_steps: int, randomness: PrivacyRandomness,
    privatizer: str | dict = "vanilla", sampling: str = "poisson", checkpoint_in: Path | None = None,
    checkpoint_out: Path | None = None, noise_multiplier: float = 1.0, callbacks: tuple[L.Callback, ...] = (),
) -> tuple[BatchRecorder, DPModule]:
    """Train `max_steps` logical steps (resuming from `checkpoint_in`), recording each step's batch (`callbacks`
    run after the recorder)."""
    torch.manual_seed(0)
    model = IndexModel()
    settings = PrivacySettings(1.0, batch_size / len(data.train), noise_multiplier, randomness)
    config = {"name": privatizer} if isinstance(privatizer, str) else privatizer
    strategy = make_strategy(OmegaConf.create(config), settings)
    module = DPModule(model, data.task, strategy, OptimizerConfig(name="sgd", lr=0.1), PrivacyLedger(1e-5),
                      float(batch_size))
    datamodule = DPDataModule(data, batch_size, sampling, randomness, eval_batch_size=64)
    recorder = BatchRecorder()
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=-1, max_steps=max_steps, logger=False, callbacks=[recorder, *callbacks],
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        limit_val_batches=0, use_distributed_sampler=False,
    )
    trainer.fit(module, datamodule=datamodule, ckpt_path=str(checkpoint_in) if checkpoint_in else None)
    if checkpoint_out is not None:
        trainer.save_checkpoint(checkpoint_out)
    return recorder, module
