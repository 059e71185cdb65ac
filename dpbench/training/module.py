"""The Lightning module: manual optimization, with the privatizer strategy forming every gradient."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch import nn

from dpbench.core.errors import ConfigurationError
from dpbench.core.optim import OptimizerConfig
from dpbench.core.tasks import Batch, Task, capped_losses, score_bound_of
from dpbench.privacy.ledger import PrivacyLedger
from dpbench.privatizers import distributed
from dpbench.privatizers.base import PrivatizerStrategy, StepContext
from dpbench.privatizers.sharding import sharded_model, unsupported_sharding
from dpbench.training.sharding import shard
from dpbench.training.step import private_step


class DPModule(L.LightningModule):
    """Knows nothing about any particular strategy: it asks the strategy for the gradient and the mechanisms."""

    def __init__(
        self,
        model: nn.Module,
        task: Task,
        strategy: PrivatizerStrategy,
        optimizer_config: OptimizerConfig,
        ledger: PrivacyLedger,
        expected_batch_size: float,
        physical_batch_size: int | None = None,
        train_stats: bool = False,
        validation_prefix: str = "val",
    ):
        """`train_stats`: log noise-free per-step statistics of the private batches (outside the guarantee).
        `validation_prefix`: `val_on_test` when the per-epoch evaluation runs on the test split (no validation
        split), so that nobody tunes on test metrics named as validation ones."""
        super().__init__()
        self.automatic_optimization = False
        self.model = model
        self.task = task
        self.strategy = strategy
        self.optimizer_config = optimizer_config
        self.ledger = ledger
        self.expected_batch_size = expected_batch_size
        self.physical_batch_size = physical_batch_size
        self.train_stats = train_stats
        self.validation_prefix = validation_prefix
        self.samples_seen = 0
        strategy.attach(model)

    def forward(self, inputs: Any) -> torch.Tensor:
        return self.model(inputs)

    def setup(self, stage: str) -> None:
        """Every rank uses rank 0's secret root, so that shared draws (GRAPE's projections) agree across ranks."""
        distributed.broadcast_randomness(self.strategy.privacy.randomness)

    def configure_model(self) -> None:
        """Under trainer.strategy=fsdp: shard the model over the data-parallel mesh, and attach the strategy again to
        the sharded parameters (fully_shard replaces every parameter by a DTensor)."""
        mesh = self.device_mesh
        if mesh is None or sharded_model(self.model):
            return
        if not self.strategy.supports_sharding:
            raise unsupported_sharding(self.strategy.name)
        self.strategy.detach()
        shard(self.model, mesh["data_parallel"])
        self.strategy.attach(self.model)

    def on_train_start(self) -> None:
        if distributed.world_size() > 1 and not self.strategy.supports_data_parallel:
            raise ConfigurationError(
                f"privatizer={self.strategy.name} does not support data parallelism yet (its noise would not be "
                "shared across ranks): run it on one device"
            )

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.strategy.configure_optimizer(self.model, self.optimizer_config)

    def training_step(self, batch: Batch, batch_idx: int) -> None:
        ctx = StepContext(self.ledger.steps, self.expected_batch_size, self.physical_batch_size)
        output = private_step(self.strategy, self.model, self.task, self.optimizers(), self.ledger, batch, ctx)
        self.samples_seen += int(output.stats.get("batch_size", 0))
        if not self.train_stats:  # noise-free statistics of private data: outside the guarantee
            return
        # per step only: an epoch mean's accumulator is not in the checkpoint, so a mid-epoch resume would skew it
        self.log("train/loss", output.loss, on_step=True, on_epoch=False, batch_size=1)
        for key, value in output.stats.items():
            self.log(f"train/{key}", value, on_step=True, on_epoch=False, batch_size=1)

    def _evaluate(self, batch: Batch, prefix: str) -> None:
        """The epoch means of the loss and the metric; with a score bound B also the mean loss capped at B per
        example (`capped_loss`), the score private tuning releases for a loss task."""
        loss_sum, metric_sum, count = self.task.metric_counts(self.model, batch)
        self.log(f"{prefix}/loss", loss_sum / max(count, 1), on_epoch=True, batch_size=count)
        if self.task.metric_name != "loss":
            self.log(f"{prefix}/{self.task.metric_name}", metric_sum / max(count, 1), on_epoch=True,
                     batch_size=count, prog_bar=True)
        bound = score_bound_of(self.task)
        if bound is not None:
            with torch.no_grad():
                capped = capped_losses(self.task.per_sample_loss(self.model, batch), bound)
            self.log(f"{prefix}/capped_loss", float(capped.sum()) / max(count, 1), on_epoch=True, batch_size=count)

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, self.validation_prefix)

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["dpbench"] = {
            "privacy_randomness": self.strategy.privacy.randomness.state_dict(),  # secret: checkpoints only
            "ledger": self.ledger.state_dict(),
            "strategy": self.strategy.state_dict(),
            "samples_seen": self.samples_seen,
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint["dpbench"]
        self.strategy.privacy.randomness.load_state_dict(state["privacy_randomness"])
        self.ledger.load_state_dict(state["ledger"])
        self.strategy.load_state_dict(state["strategy"])
        self.samples_seen = state["samples_seen"]
