"""A dpbench privatizer in your own training loop: a plain PyTorch loop (`make_private`) or your own Lightning Trainer
(`make_private_module`), with the same privacy plan, contract checks and accounting as a dpbench run.

The accountant assumes Poisson sampling (each sample joins each step's batch independently with probability q), so
the loader must be one: `poisson_loader(dataset, batch_size)` builds it. A shuffled loader with fixed-size batches is
refused unless `accept_non_poisson=True`, and then every epsilon it reports carries that caveat.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import lightning as L
from torch import nn
from torch.optim import Optimizer
from torch.utils._pytree import tree_map
from torch.utils.data import DataLoader, Dataset, default_collate

from dpbench.core.config import PrivacyConfig, check_precision
from dpbench.core.errors import ConfigurationError
from dpbench.core.optim import OptimizerConfig
from dpbench.core.tasks import Batch, ClassificationTask, Task
from dpbench.data.bundle import DataBundle
from dpbench.privacy.accountant import EpsilonReport, PrivacyAccountant
from dpbench.privacy.ledger import PrivacyLedger, Underreport
from dpbench.privacy.randomness import PrivacyRandomness
from dpbench.privacy.sampling import PoissonBatchSampler
from dpbench.privatizers import PrivacySettings, PrivatizerStrategy, StepContext, StepOutput, make_strategy
from dpbench.privatizers.base import PrivatizerStrategy as _Base
from dpbench.privatizers.privacy_plan import PrivacyPlan, declared_composition, make_plan
from dpbench.training.datamodule import DPDataModule
from dpbench.training.module import DPModule
from dpbench.training.step import private_step

NON_POISSON_CAVEAT = ("fixed-size shuffled batches accounted as Poisson sampling at q = batch_size / N, which such "
                      "batches do not strictly satisfy")

Privatizer = str | Mapping[str, Any]
"""A privatizer name (`"vanilla"`), or a config node: `{"name": "vanilla", "engine": "hooks"}`, or
`{"_target_": MyStrategy, ...}` for your own PrivatizerStrategy subclass."""


class _Collate:
    """Batches as (inputs, targets); an empty Poisson batch keeps the samples' shapes with batch dimension 0."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __call__(self, samples: list[Any]) -> Batch:
        if samples:
            return tuple(default_collate(samples))  # type: ignore[return-value]
        inputs, targets = default_collate([self.dataset[0]])
        return tree_map(lambda t: t[:0], inputs), targets[:0]


def poisson_loader(dataset: Dataset, batch_size: int, randomness: PrivacyRandomness | None = None) -> DataLoader:
    """A loader whose every step draws each sample with probability q = batch_size / len(dataset) (the accountant's
    assumption); batches vary in size and may be empty. `randomness` (default: 128 secret bits from the OS) is the
    root of the sampling draws and, under `make_private`, of the noise."""
    size = len(dataset)  # type: ignore[arg-type]
    if not 0 < batch_size <= size:
        raise ConfigurationError(f"batch_size must lie in (0, {size}], got {batch_size}")
    sampler = PoissonBatchSampler(size, batch_size / size, randomness or PrivacyRandomness())
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=_Collate(dataset))


@dataclass(frozen=True)
class PrivacySpent:
    """What the training has spent so far, by the strategy's own accountant."""

    epsilon: float
    """Upper bound (the PRV accountant's; inf when no finite bound holds)."""
    delta: float
    steps: int
    sampling: str
    """poisson, or shuffle (accepted with accept_non_poisson: see caveat)."""
    caveat: str | None
    report: EpsilonReport | None
    ledger_underreported: Underreport | None = None
    """Set when the recorded steps composed less than the privatizer's declared composition: `epsilon` is then the
    declared figure (see PrivacyLedger)."""


def _plan(
    model: nn.Module, privatizer: Privatizer, sampling_rate: float, steps: int, randomness: PrivacyRandomness,
    target_epsilon: float | None, noise_multiplier: float | None, delta: float, clip_norm: float, sampling: str,
    eps_error: float, train_size: int, allow_large_delta: bool, optimizer: object,
) -> tuple[PrivatizerStrategy, PrivacyPlan]:
    """The strategy (checked against its contract) with its noise calibrated for `steps` (not yet attached).

    Both a target epsilon and a noise multiplier are refused: one of them would be silently ignored."""
    if target_epsilon is not None and noise_multiplier is not None:
        raise ConfigurationError(
            f"give either target_epsilon or noise_multiplier, not both (got {target_epsilon:g} and "
            f"{noise_multiplier:g}): a fixed noise multiplier spends what it spends, whatever the target"
        )
    config = {"name": privatizer} if isinstance(privatizer, str) else dict(privatizer)
    settings = PrivacySettings(clip_norm, sampling_rate, noise_multiplier, randomness)
    strategy = make_strategy(config, settings)
    strategy.preflight(model, optimizer if isinstance(optimizer, OptimizerConfig) else None)
    privacy = PrivacyConfig(epsilon=target_epsilon, delta=delta, noise_multiplier=noise_multiplier,
                            clip_norm=clip_norm, sampling=sampling, accountant_eps_error=eps_error,
                            allow_large_delta=allow_large_delta)
    return strategy, make_plan(strategy, privacy, sampling_rate, steps, model, train_size)


class PrivateTraining:
    """One logical step at a time: `step(batch)` forms the privatized gradient, updates the model and records the
    step's mechanisms; `epsilon()` composes what has been recorded."""

    def __init__(self, model: nn.Module, optimizer: Optimizer, strategy: PrivatizerStrategy, task: Task,
                 plan: PrivacyPlan, expected_batch_size: float, eps_error: float, caveat: str | None,
                 physical_batch_size: int | None = None):
        self.model = model
        self.optimizer = optimizer
        self.strategy = strategy
        self.task = task
        self.plan = plan
        self.expected_batch_size = expected_batch_size
        self.caveat = caveat
        self.physical_batch_size = physical_batch_size
        self.ledger = PrivacyLedger(plan.delta, PrivacyAccountant(eps_error=eps_error),
                                    declared_composition(strategy, plan))
        self.steps = 0
        """Logical steps taken (what the ledger holds for a private strategy)."""

    @property
    def noise_multiplier(self) -> float | None:
        return self.plan.noise_multiplier

    def step(self, batch: Batch) -> StepOutput:
        if self.plan.private and self.plan.calibrated and self.steps >= self.plan.steps:
            raise ConfigurationError(f"the noise was calibrated to privacy.epsilon for {self.plan.steps} steps; step "
                                     f"{self.steps + 1} would spend more: plan more steps in make_private")
        self.model.train()
        ctx = StepContext(self.steps, self.expected_batch_size, self.physical_batch_size)
        output = private_step(self.strategy, self.model, self.task, self.optimizer, self.ledger,
                              tuple(batch), ctx)  # type: ignore[arg-type]
        self.steps += 1
        return output

    def epsilon(self) -> PrivacySpent:
        """Never below the privatizer's declared composition for the steps taken (see PrivacyLedger)."""
        report = self.ledger.epsilon() if self.plan.private else None
        spent = report.epsilon if report else math.inf
        caveat = "; ".join(c for c in (self.caveat, self.strategy.checks.caveat()) if c) or None
        return PrivacySpent(spent, self.plan.delta, self.steps, self.plan.sampling, caveat, report,
                            self.ledger.underreported)


def _sampling(data_loader: DataLoader, accept_non_poisson: bool) -> tuple[float, PrivacyRandomness, str | None]:
    """(q, the secret root, caveat) of a loader: a Poisson loader's own, or a shuffled one's when its caveat is
    accepted."""
    sampler = data_loader.batch_sampler
    if isinstance(sampler, PoissonBatchSampler):
        return sampler.sampling_rate, sampler.randomness, None
    described = f"{type(data_loader.sampler).__name__} with batch_size={data_loader.batch_size}"
    if not accept_non_poisson:
        raise ConfigurationError(
            f"the data loader is not Poisson-sampled ({described}); the accountant assumes Poisson sampling. Build it "
            "with dpbench.poisson_loader(dataset, batch_size), or pass accept_non_poisson=True to account it as "
            "Poisson sampling anyway (every epsilon then carries that caveat)"
        )
    if data_loader.batch_size is None:
        raise ConfigurationError(f"accept_non_poisson needs a loader with a fixed batch_size ({described})")
    return data_loader.batch_size / len(data_loader.dataset), PrivacyRandomness(), NON_POISSON_CAVEAT  # type: ignore


def make_private(
    model: nn.Module,
    optimizer: Optimizer | OptimizerConfig,
    data_loader: DataLoader,
    privatizer: Privatizer = "vanilla",
    *,
    epochs: int | None = None,
    steps: int | None = None,
    target_epsilon: float | None = None,
    noise_multiplier: float | None = None,
    delta: float = 1e-5,
    clip_norm: float = 1.0,
    task: Task | None = None,
    physical_batch_size: int | None = None,
    accept_non_poisson: bool = False,
    eps_error: float = 0.01,
    allow_large_delta: bool = False,
) -> PrivateTraining:
    """Wrap a model for a plain PyTorch loop: the noise is calibrated to `target_epsilon` over `steps` (or `epochs`
    passes of the loader), or fixed by `noise_multiplier` (not both), before the first step. A `delta` at or above
    1/N is refused unless `allow_large_delta` (as privacy.allow_large_delta).

    `optimizer` is yours (a torch Optimizer over the model's parameters) unless the privatizer builds its own
    (GRAPE, DP-GaLore, sparse), which then takes an OptimizerConfig. `task` gives the per-sample loss (default:
    cross-entropy classification).
    """
    sampling_rate, randomness, caveat = _sampling(data_loader, accept_non_poisson)
    if (epochs is None) == (steps is None):
        raise ConfigurationError("give make_private either epochs or steps")
    total = steps if steps is not None else epochs * len(data_loader)  # type: ignore[operator]
    strategy, plan = _plan(model, privatizer, sampling_rate, total, randomness, target_epsilon, noise_multiplier,
                           delta, clip_norm, "poisson" if caveat is None else "shuffle", eps_error,
                           len(data_loader.dataset), allow_large_delta, optimizer)  # type: ignore[arg-type]
    strategy.attach(model)
    if isinstance(optimizer, OptimizerConfig):
        optimizer = strategy.configure_optimizer(model, optimizer)
    elif type(strategy).configure_optimizer is not _Base.configure_optimizer:
        raise ConfigurationError(f"privatizer {strategy.name!r} builds its own optimizer: pass "
                                 "optimizer=dpbench.OptimizerConfig(name=..., lr=...) instead of a torch optimizer")
    training = PrivateTraining(model, optimizer, strategy, task or ClassificationTask(), plan,
                               sampling_rate * len(data_loader.dataset), eps_error, caveat,  # type: ignore[arg-type]
                               physical_batch_size)
    if isinstance(data_loader.batch_sampler, PoissonBatchSampler):  # step t's batch keyed by t: fresh every epoch
        data_loader.batch_sampler.first_step = lambda: training.steps
    return training


class PrivateModule(DPModule):
    """dpbench's Lightning module for your own Trainer; it refuses to train past the planned steps, and mixed
    precision other than bf16-mixed (see dpbench.core.config.check_precision)."""

    plan: PrivacyPlan

    def setup(self, stage: str) -> None:
        if stage == "fit":
            check_precision(self.trainer.precision)
        super().setup(stage)

    def on_train_start(self) -> None:
        super().on_train_start()
        max_steps = self.trainer.max_steps
        if self.plan.private and self.plan.calibrated and not 0 < max_steps <= self.plan.steps:
            raise ConfigurationError(f"Trainer(max_steps={max_steps}) exceeds the {self.plan.steps} steps the noise "
                                     "was calibrated for: pass max_steps=module.plan.steps")

    def on_train_end(self) -> None:
        """The end of a fit checks the ledger against the declared composition, so an under-report is said then."""
        self.epsilon()

    def epsilon(self) -> EpsilonReport | None:
        """Never below the privatizer's declared composition for the steps taken (`ledger.underreported` says when
        the ledger's own figure was)."""
        return self.ledger.epsilon() if self.plan.private else None


def make_private_module(
    model: nn.Module,
    data: DataBundle,
    privatizer: Privatizer = "vanilla",
    *,
    optimizer: OptimizerConfig,
    batch_size: int,
    steps: int,
    target_epsilon: float | None = None,
    noise_multiplier: float | None = None,
    delta: float = 1e-5,
    clip_norm: float = 1.0,
    physical_batch_size: int | None = None,
    eval_batch_size: int = 1000,
    privacy_seed: int | None = None,
    eps_error: float = 0.01,
    allow_large_delta: bool = False,
) -> tuple[PrivateModule, L.LightningDataModule]:
    """A Lightning module and data module for `trainer.fit(module, datamodule=...)` with your own Trainer: Poisson
    batches keyed by the trainer's step, the noise calibrated for `steps`. Give the Trainer `max_steps=steps` and
    `use_distributed_sampler=False`."""
    randomness = PrivacyRandomness(privacy_seed)
    datamodule = DPDataModule(data, batch_size, "poisson", randomness, eval_batch_size)
    strategy, plan = _plan(model, privatizer, datamodule.sampling_rate, steps, randomness, target_epsilon,
                           noise_multiplier, delta, clip_norm, "poisson", eps_error, len(data.train), allow_large_delta,
                           optimizer)
    ledger = PrivacyLedger(delta, PrivacyAccountant(eps_error=eps_error), declared_composition(strategy, plan))
    module = PrivateModule(model, data.task, strategy, optimizer, ledger, float(batch_size), physical_batch_size)
    module.plan = plan
    return module, datamodule
