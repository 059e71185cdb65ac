"""The PrivatizerStrategy interface: the unit of change in dpbench.

A strategy decides how one logical step's privatized gradient is formed (it always starts from the per-sample
loss vector), which optimizer it needs, who applies the update, and which mechanisms one step composes for the
accountant. The Lightning module only calls these methods; it never knows which strategy it runs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.utils._pytree import tree_map

from dpbench.core.optim import build_optimizer, check_optimizer
from dpbench.core.tasks import Batch, Task, batch_size_of
from dpbench.privacy.mechanisms import Composition, Mechanism, SubsampledGaussian
from dpbench.privacy.randomness import PrivacyRandomness, PrivateStream
from dpbench.privatizers import distributed
from dpbench.privatizers.per_sample import trainable_parameters
from dpbench.privatizers.per_sample.check_schedule import CheckSchedule
from dpbench.privatizers.sharding import as_sharded_grad, is_sharded, shard_noise, shard_of_sum, sharded_model


@dataclass
class PrivacySettings:
    """What the privacy plan hands a strategy: noise_multiplier is the calibrated (base) sigma."""

    clip_norm: float
    sampling_rate: float
    noise_multiplier: float | None
    randomness: PrivacyRandomness = field(default_factory=PrivacyRandomness)
    """The run's secret randomness: every secret draw of the strategy (noise, directions, projections, selection)."""


@dataclass
class StepContext:
    step: int
    """Logical step index, 0-based, counted across epochs and resumes."""
    expected_batch_size: float
    """q * N: the divisor of the noisy sum (never the realised Poisson batch size)."""
    physical_batch_size: int | None = None
    """Largest micro-batch run at once (gradient accumulation); None runs the logical batch whole."""


@dataclass
class StepOutput:
    loss: float
    stats: dict[str, float]


def split_batch(batch: Batch, size: int | None) -> list[Batch]:
    """Micro-batches of at most `size` samples (the whole batch when size is None); an empty batch stays one."""
    total = batch_size_of(batch)
    if size is None or total <= size:
        return [batch]
    inputs, targets = batch
    micro = []
    for start in range(0, total, size):
        part = slice(start, start + size)
        micro.append((tree_map(lambda t, part=part: t[part], inputs), targets[part]))
    return micro


def aligned_micro_batches(micro_batches: list[Batch], device: torch.device) -> list[Batch]:
    """As many micro-batches as the rank with the most, the missing ones empty."""
    count = torch.tensor([len(micro_batches)], device=device)
    if distributed.is_distributed():
        torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MAX)
    inputs, targets = micro_batches[-1]
    empty = (tree_map(lambda t: t[:0], inputs), targets[:0])
    return micro_batches + [empty] * (int(count.item()) - len(micro_batches))


def merge_stats(parts: list[dict[str, float]]) -> dict[str, float]:
    """Combine micro-batch statistics: sizes and counts add up, rates are averaged by batch size."""
    total = sum(p.get("batch_size", 0.0) for p in parts)
    merged: dict[str, float] = {"batch_size": total}
    for key in {k for p in parts for k in p} - {"batch_size"}:
        values = [(p[key], p.get("batch_size", 0.0)) for p in parts if key in p]
        if key.endswith(("_samples", "_count")):
            merged[key] = sum(v for v, _ in values)
        else:
            weight = sum(w for _, w in values)
            merged[key] = sum(v * w for v, w in values) / weight if weight else values[0][0]
    return merged


class PrivatizerStrategy(ABC):
    name: ClassVar[str]
    is_private: ClassVar[bool] = True
    supports_data_parallel: ClassVar[bool] = True
    """False for strategies that noise outside `noised_sum` / `write_noisy_mean`: refused under DDP."""
    supports_sharding: ClassVar[bool] = False
    """True where the strategy writes its noisy gradient through `write_noisy_mean`, which reduce-scatters and noises
    FSDP2's shards (privatizers.sharding), and its engine runs on a sharded model: trainer.strategy=fsdp."""
    supports_mixed_precision: ClassVar[bool] = False
    """True where every tensor the strategy forms from the recorded forward is widened to float32 before a norm or a
    sum (per_sample.precision.widened, as the hook and functorch engines do): only then is a step at bf16-mixed
    accepted. Off by default, so that a plugin is refused rather than clipped in bf16."""

    def __init__(self, config: Any, privacy: PrivacySettings):
        self.config = config
        self.privacy = privacy
        self.noise = PrivateStream(privacy.randomness, "noise")
        self.checks = CheckSchedule(privacy.randomness)
        """When the per-sample engine checks itself against per-example passes: hand it to the engine you build."""
        self._shard_draws: tuple[int, Any] | None = None
        """(step, this rank's draws for its shards at that step) under FSDP2."""

    # -- privacy ---------------------------------------------------------------------------------------------
    @property
    def noise_multiplier(self) -> float:
        if self.privacy.noise_multiplier is None:
            raise RuntimeError("the noise multiplier has not been calibrated")
        return self.privacy.noise_multiplier

    def step_mechanisms(self, step: int) -> list[Mechanism]:
        """Mechanisms composed by logical step `step` (default: one subsampled Gaussian)."""
        return [SubsampledGaussian(self.privacy.sampling_rate, self.noise_multiplier)]

    def composition(self, noise_multiplier: float, steps: int) -> Composition:
        """A whole run's composition for base sigma `noise_multiplier`: what calibration searches over.

        The contract (checked by dpbench.privatizers.contract before training): a non-empty list of (Mechanism,
        count) pairs bounding every release of a `steps`-step run, the same mechanisms `step_mechanisms` reports step
        by step. This default holds only for N(0, (sigma C)^2) added once per step to a sum of per-sample
        contributions of norm at most C over a Poisson sample at rate q; override it for anything else.
        """
        return [(SubsampledGaussian(self.privacy.sampling_rate, noise_multiplier), steps)]

    def prepare(self, model: nn.Module, steps: int, delta: float, epsilon: float | None, accountant: Any) -> None:
        """Fix what the run's privacy depends on besides sigma (e.g. sparse's selection budget), before calibration."""

    def epsilon_advice(
        self, noise_multiplier: float, target: float, steps: int, delta: float, accountant: Any
    ) -> str | None:
        """How to change the strategy's own config so that the run's epsilon at `noise_multiplier` falls within
        `target` (an infinite target: becomes finite), for refusals to name the real lever (None: no such setting)."""
        return None

    def privacy_report(self, steps: int, delta: float) -> dict[str, Any]:
        """Strategy-specific privacy figures for results.json (e.g. a paper's closed-form bound beside the PRV's)."""
        return {}

    # -- before anything runs ---------------------------------------------------------------------------------
    def preflight(self, model: nn.Module, optimizer_config: Any | None) -> None:
        """Refuse what attach or configure_optimizer would refuse later, and a setting under which this model would
        not get the method the run is named after. The run and `dpbench.plan` both call it (from prepare_run), and
        make_private, before any data is trained on or any W&B run is made. `optimizer_config` None: the caller
        brings its own torch optimizer."""
        if optimizer_config is not None:
            check_optimizer(optimizer_config)

    per_sample_activation_share = 0.0
    """The memory a private step keeps beside the model's activations, as a share of them (the hook engine records
    every layer's input and output gradient, about one more copy; measured: BENCHMARKS.md, issue 49)."""

    def per_sample_state_bytes(self, model: nn.Module, micro_batch: int, activation_bytes: int) -> int:
        """Memory the privatizer holds for one micro-batch besides the activations (the engine's records, per-sample
        gradients where it builds them), for the estimate a run is checked against before it trains."""
        return int(self.per_sample_activation_share * activation_bytes)

    def optimizer_state_bytes(self, model: nn.Module, optimizer_config: Any) -> int:
        """What the optimizer keeps beside the parameters, for the memory estimate: Adam's two moments, SGD's
        momentum buffer where momentum is set."""
        trainable = sum(p.numel() * p.element_size() for p in trainable_parameters(model).values())
        name = str(getattr(optimizer_config, "name", ""))
        if name == "sgd":
            return trainable if getattr(optimizer_config, "momentum", 0) else 0
        return 2 * trainable

    def method_details(self, model: nn.Module) -> dict[str, Any]:
        """What the method does to this model, for results.json's `method_details` (the layers it projects and
        their ranks, its r, its projection dimension, the fraction of coordinates it selects)."""
        return {}

    # -- training --------------------------------------------------------------------------------------------
    def attach(self, model: nn.Module) -> None:
        """Validate the model and set up whatever the strategy needs on it (hooks, engines)."""

    def detach(self) -> None:
        """Undo attach (its hooks), before the model is sharded and attached again."""
        detach = getattr(getattr(self, "engine", None), "detach", None)
        if detach is not None:
            detach()

    def configure_optimizer(self, model: nn.Module, optimizer_config: Any) -> Optimizer:
        return build_optimizer(trainable_parameters(model).values(), optimizer_config)

    def privatize(self, model: nn.Module, task: Task, batch: Batch, ctx: StepContext) -> StepOutput:
        """Write the privatized gradient of one logical step into each trainable parameter's .grad.

        The logical batch runs in micro-batches of ctx.physical_batch_size; noise is added once, in finalize.
        """
        self.checks.begin_step(ctx.step)
        losses, stats = [], []
        micro_batches = split_batch(batch, ctx.physical_batch_size)
        if sharded_model(model):  # every rank runs the same forwards (FSDP2 gathers parameters in each)
            micro_batches = aligned_micro_batches(micro_batches, next(model.parameters()).device)
        for micro in micro_batches:
            loss_sum, micro_stats = self.accumulate(model, task, micro, ctx)
            losses.append(loss_sum)
            stats.append(micro_stats)
        self.finalize(model, ctx)
        size = batch_size_of(batch)
        return StepOutput(loss=sum(losses) / size if size else float("nan"), stats=merge_stats(stats))

    @abstractmethod
    def accumulate(self, model: nn.Module, task: Task, batch: Batch, ctx: StepContext) -> tuple[float, dict]:
        """Add one micro-batch's (clipped) contributions to the strategy's running sums.

        Returns the micro-batch's summed loss and its statistics (always with "batch_size"). May be called with an
        empty batch.
        """

    @abstractmethod
    def finalize(self, model: nn.Module, ctx: StepContext) -> None:
        """Noise the accumulated sums once, write .grad, and reset the sums for the next logical step."""

    def skips(self, model: nn.Module, batch: Batch) -> bool:
        """Whether a micro-batch adds nothing and needs no forward: an empty one, unless the model is sharded (every
        rank's forwards gather parameters together)."""
        return batch_size_of(batch) == 0 and not sharded_model(model)

    def apply_update(self, optimizer: Optimizer) -> None:
        optimizer.step()

    # -- shared pieces ---------------------------------------------------------------------------------------
    def noised_sum(self, local_sum: Tensor, std: float) -> Tensor:
        """This rank's clipped sum -> the global sum plus N(0, std^2) drawn once (rank 0), identical on all ranks."""
        if distributed.rank() == 0:
            local_sum = self.noise.normal_like(local_sum, std).add_(local_sum)  # into the fresh noise buffer
        return distributed.all_reduce_sum(local_sum)

    def write_noisy_mean(self, model: nn.Module, clipped_sums: dict[str, Tensor], ctx: StepContext) -> None:
        """grad = (sum of clipped contributions + N(0, (sigma C)^2)) / expected batch size, for every parameter.
        Each sum leaves `clipped_sums` as its gradient is written, so the step never holds every sum and every
        gradient at once (one copy of the parameters less at the step's peak)."""
        std = self.noise_multiplier * self.privacy.clip_norm
        for name, param in trainable_parameters(model).items():
            total = clipped_sums.pop(name, None)
            if is_sharded(param):
                param.grad = self.noised_shard_mean(param, total, std, ctx)
                continue
            total = torch.zeros_like(param) if total is None else total.to(param.dtype)
            param.grad = self.noised_sum(total, std).div_(ctx.expected_batch_size)

    def noised_shard_mean(self, param: Tensor, total: Tensor | None, std: float, ctx: StepContext) -> Tensor:
        """A sharded parameter's gradient: this rank's rows of the global clipped sum (`total`: this rank's
        full-shaped sum, None for zero) plus noise from this rank's key for the step, over the expected batch size.
        The draws continue across the step's parameters, in their order."""
        total = torch.zeros(param.shape, device=param.device) if total is None else total
        local = shard_of_sum(total.to(param.dtype), param)
        if self._shard_draws is None or self._shard_draws[0] != ctx.step:
            self._shard_draws = (ctx.step, shard_noise(self.privacy.randomness, ctx.step, param, local.device))
        noisy = self._shard_draws[1].normal(local.shape, local.dtype).mul_(std).add_(local)
        return as_sharded_grad(noisy.div_(ctx.expected_batch_size), param)

    def state_dict(self) -> dict[str, Any]:
        return {"noise": self.noise.state_dict(), "checks": self.checks.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.noise.load_state_dict(state["noise"])
        self.checks.load_state_dict(state["checks"])
