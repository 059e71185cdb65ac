"""What a model is trained to do: the per-sample loss every privatizer needs, and the test metric."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

Batch = tuple[Any, Tensor]
"""(inputs, targets): inputs is a tensor or a dict of tensors whose first dimension is the batch."""

Forward = Callable[[Any], Tensor]


def batch_size_of(batch: Batch) -> int:
    return int(batch[1].shape[0])


def score_bound_of(task: Task) -> float | None:
    """The task's score_bound; a plugin's task written before it existed declares none."""
    return getattr(task, "score_bound", None)


def capped_losses(losses: Tensor, bound: float) -> Tensor:
    """Each loss capped at `bound` (a non-finite one counts as the bound): each lies in [0, bound], so adding or
    removing one example moves their sum by at most `bound`."""
    return torch.where(losses < bound, losses, torch.full_like(losses, bound))


class Task(Protocol):
    """A task gives every privatizer the per-sample loss vector, and the evaluation its metric."""

    metric_name: str
    score_bound: float | None
    """B: a loss-scored task's cap on each example's (non-negative) loss, so that the validation split's capped mean
    loss is a score of sensitivity B/n that private tuning can release; None where the metric is bounded already
    (accuracy) or the task gives no bound (its selection on the loss is then not accounted)."""

    def per_sample_loss(self, forward: Forward, batch: Batch) -> Tensor:
        """(B,) losses; sample i's loss depends on sample i only."""
        ...

    def metric_counts(self, forward: Forward, batch: Batch) -> tuple[float, float, int]:
        """(summed loss, summed metric, samples) of one evaluation batch."""
        ...


class ClassificationTask:
    """Cross-entropy per sample; accuracy as the test metric."""

    metric_name = "accuracy"
    score_bound = None

    def per_sample_loss(self, forward: Forward, batch: Batch) -> Tensor:
        inputs, targets = batch
        return F.cross_entropy(forward(inputs), targets, reduction="none")

    @torch.no_grad()
    def metric_counts(self, forward: Forward, batch: Batch) -> tuple[float, float, int]:
        """(summed loss, correct predictions, samples) of one evaluation batch."""
        inputs, targets = batch
        logits = forward(inputs)
        loss = F.cross_entropy(logits, targets, reduction="sum")
        correct = (logits.argmax(dim=-1) == targets).sum()
        return float(loss), float(correct), int(targets.shape[0])


class NegativeSamplingTask:
    """Word2vec with negative sampling: the model returns (positive, negative) scores of each sample.

    loss_i = -mean_j log s(pos_ij) - sum_n log s(-neg_in) (Mikolov et al. 2013; one positive for CBOW, the
    context words for skip-gram). The metric is the loss itself.
    """

    metric_name = "loss"
    score_bound = 30.0
    """Above the loss at model.init_std=1 (about 19.4), far above a trained model's (4-8): few examples are capped."""

    def per_sample_loss(self, forward: Forward, batch: Batch) -> Tensor:
        positive, negative = forward(batch[0])
        return -F.logsigmoid(positive).mean(1) - F.logsigmoid(-negative).sum(1)

    @torch.no_grad()
    def metric_counts(self, forward: Forward, batch: Batch) -> tuple[float, float, int]:
        loss = float(self.per_sample_loss(forward, batch).sum())
        return loss, loss, batch_size_of(batch)
