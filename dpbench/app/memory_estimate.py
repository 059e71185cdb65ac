"""The peak memory a run will need, estimated before it trains, so that a run that cannot fit is refused with the
setting that makes it fit instead of being found out by the kernel's OOM killer half an hour in.

Training's peak: the weights, their gradients, the optimizer's state, the privatizer's per-sample state (per-sample
gradients where its engine builds them) and the activations autograd keeps for the backward of one micro-batch;
evaluation's: the weights and the state that outlives training, plus one evaluation batch's largest layer outputs.
The activations are measured, not modelled: one sample's forward with a saved-tensors hook counts the bytes autograd
keeps (and the largest layer output), and they scale with the batch. The estimate leaves out the allocator's slack
and the interpreter, so it is checked against a share of the free memory, and `trainer.memory_check=false` skips
the check.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dpbench.core.errors import ConfigurationError
from dpbench.core.tasks import Task
from dpbench.data.bundle import DataBundle
from dpbench.privatizers import PrivatizerStrategy
from dpbench.privatizers.per_sample import trainable_parameters
from dpbench.profiling.memory import free_mb

log = logging.getLogger(__name__)
MB = 2**20
FITS = 0.9
"""The share of the free memory an estimate may fill: the rest is the allocator's slack and what is not counted."""
ADVICE_HEADROOM = 0.95
"""The share of that budget, less the weights, gradients and optimizer state, that an advised batch's per-sample
state and activations fill: the process that follows the advice finds a few MB more or less free than the one that
gave it, and must not be refused at the boundary."""


@dataclass(frozen=True)
class MemoryEstimate:
    weights_mb: float
    gradients_mb: float
    optimizer_mb: float
    per_sample_mb: float
    activations_mb: float | None
    """None: one sample's forward could not be measured (the check then leaves the run alone)."""
    evaluation_mb: float | None
    micro_batch: int
    eval_batch: int
    device: str
    free_mb: float | None

    @property
    def training_mb(self) -> float | None:
        if self.activations_mb is None:
            return None
        return self.weights_mb + self.gradients_mb + self.optimizer_mb + self.per_sample_mb + self.activations_mb

    @property
    def peak_mb(self) -> float | None:
        if self.training_mb is None or self.evaluation_mb is None:
            return None
        return max(self.training_mb, self.weights_mb + self.optimizer_mb + self.evaluation_mb)

    def describe(self) -> str:
        if self.peak_mb is None:
            return "memory: not estimated (one sample's forward could not be measured)"
        free = f" of {self.free_mb:,.0f} MB free on {self.device}" if self.free_mb is not None else ""
        return (f"memory: about {self.peak_mb:,.0f} MB{free} (weights {self.weights_mb:,.0f}, gradients "
                f"{self.gradients_mb:,.0f}, optimizer {self.optimizer_mb:,.0f}, per-sample {self.per_sample_mb:,.0f}, "
                f"activations {self.activations_mb:,.0f} at {self.micro_batch} samples; evaluation "
                f"{self.evaluation_mb:,.0f} at {self.eval_batch})")


def _one_sample_activations(model: nn.Module, task: Task, data: DataBundle) -> tuple[int, int] | None:
    """(bytes autograd keeps for one sample's backward, largest layer output of one sample), or None when the probe
    fails. Evaluation mode and a forked RNG: the probe changes no buffer and draws nothing from the run's streams."""
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}
    largest = [0]

    def pack(tensor: Tensor) -> Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    def record(_module: nn.Module, _inputs: object, output: object) -> None:
        if isinstance(output, Tensor):
            largest[0] = max(largest[0], output.untyped_storage().nbytes())

    handles = [module.register_forward_hook(record) for module in model.modules()]
    training = model.training
    try:
        sample = data.train.__getitems__([0])
        with torch.random.fork_rng(devices=[]), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model.eval()
            task.per_sample_loss(model, sample).sum()
    except Exception as error:  # a model or task the probe cannot drive: no estimate, no refusal
        log.debug("memory estimate: one sample's forward failed (%s)", error)
        return None
    finally:
        model.train(training)
        for handle in handles:
            handle.remove()
    return sum(kept.values()), largest[0]


def estimate_memory(model: nn.Module, data: DataBundle, strategy: PrivatizerStrategy, optimizer: object,
                    micro_batch: int, eval_batch: int, device: torch.device) -> MemoryEstimate:
    trainable = sum(p.numel() * p.element_size() for p in trainable_parameters(model).values())
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    probe = _one_sample_activations(model, data.task, data)
    activations = None if probe is None else probe[0] * micro_batch
    evaluation = None if probe is None else 2 * probe[1] * eval_batch / MB  # a layer's input and output at once
    per_sample = strategy.per_sample_state_bytes(model, micro_batch, activations or 0)
    return MemoryEstimate(
        weights / MB, trainable / MB, strategy.optimizer_state_bytes(model, optimizer) / MB, per_sample / MB,
        None if activations is None else activations / MB, evaluation, micro_batch, eval_batch, str(device),
        free_mb(device),
    )


def check_fits(estimate: MemoryEstimate, batch_size: int) -> None:
    """Refuse a run whose estimated peak is past the free memory, naming the settings that bring it under."""
    if estimate.peak_mb is None or estimate.free_mb is None or estimate.peak_mb <= FITS * estimate.free_mb:
        return
    budget = FITS * estimate.free_mb
    fixed = estimate.weights_mb + estimate.gradients_mb + estimate.optimizer_mb
    advice = []
    training_per_sample = ((estimate.per_sample_mb + (estimate.activations_mb or 0.0)) / estimate.micro_batch)
    if estimate.training_mb is not None and estimate.training_mb > budget and training_per_sample > 0:
        fitting = int(ADVICE_HEADROOM * (budget - fixed) / training_per_sample)
        advice.append(f"physical_batch_size={fitting} (micro-batches: the logical batch_size={batch_size}, hence the "
                      "privacy, stays)" if fitting >= 1 else
                      "a smaller model (its weights, gradients and optimizer state alone do not fit)")
    evaluation_per_sample = (estimate.evaluation_mb or 0.0) / estimate.eval_batch
    if estimate.weights_mb + estimate.optimizer_mb + (estimate.evaluation_mb or 0.0) > budget and evaluation_per_sample:
        fitting = int(ADVICE_HEADROOM * (budget - estimate.weights_mb - estimate.optimizer_mb) / evaluation_per_sample)
        advice.append(f"eval_batch_size={max(1, fitting)}")
    raise ConfigurationError(
        f"this run needs {estimate.describe().removeprefix('memory: ')}, more than {FITS:.0%} of the free memory: set "
        f"{' and '.join(advice) or 'a smaller batch'}; trainer.memory_check=false runs it anyway"
    )
