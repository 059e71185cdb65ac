"""White-box gradient canaries trained through the real run (`run_experiment`), with every iterate recorded.

The data set is `real_size` public samples (binary labels from a fixed linear rule on `features` coordinates) plus
m = `canaries` slots. Slot k holds canary k, the input `scale` * e_(features + k) with label 0, when k is a
member, else a null canary (the zero input: zero gradient). The model is a bias-free linear softmax classifier
with two classes, initialised at zero. So canary k's per-sample gradient lives in column features + k alone, which
no other sample touches, and always points along (-1, 1): clipped to C (scale is large enough), each step that
samples it moves the column by lr * C / B along (1, -1) / sqrt(2), and every other change of that column is noise.

Both the data set and the model enter through the project's own registries, so the run is the real one: the
Hydra config, DPDataModule and its Poisson sampler, the strategy, DPModule, the accountant, results.json. Which
slots are members is the audit's secret and never appears in the config.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from dpbench.app.hydra_setup import compose
from dpbench.app.run import run_experiment
from dpbench.core.registry import Component
from dpbench.core.results import read_results
from dpbench.data import DATASETS, DataBundle, TensorSplit
from dpbench.models import MODELS

DATA_NAME = "audit_canaries"
MODEL_NAME = "audit_linear"
SETTINGS = [
    "seed=0", "batch_size=60", "epochs=20", "eval_batch_size=1000", "privacy.epsilon=null",
    "privacy.noise_multiplier=1.5", "privacy.delta=1e-5",
    "optimizer=sgd", "optimizer.lr=0.1", "trainer.accelerator=cpu", "trainer.enable_progress_bar=false",
    "trainer.checkpoint=false", "logger.csv=false", "logger.wandb=false", "profiler.warmup_steps=0",
]
"""The audited run unless overridden: 3000 samples at q = 0.02, 50 steps an epoch, 1000 steps, sigma 1.5 (the
accountant's epsilon is about 2; a fixed sigma spares both runs the calibration)."""


@dataclass
class CanaryDataConfig:
    name: str = DATA_NAME
    real_size: int = 2000
    features: int = 20
    canaries: int = 1000
    scale: float = 10.0
    """Canary input norm: its gradient norm stays far above the clip norm while its column is near zero."""
    test_size: int = 200
    data_seed: int = 0
    """The public samples are public: the attacker knows them (as DP's adversary knows everyone but one)."""


@dataclass
class LinearModelConfig:
    name: str = MODEL_NAME


def audit_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The project's default config with the canary data and model, quiet settings, then `overrides`."""
    cfg = compose(SETTINGS)
    OmegaConf.set_struct(cfg, False)
    cfg.data = OmegaConf.structured(CanaryDataConfig)
    cfg.model = OmegaConf.structured(LinearModelConfig)
    return OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))


def _real_samples(
    count: int, rule: Tensor, config: CanaryDataConfig, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    inputs = torch.zeros(count, config.features + config.canaries)
    inputs[:, : config.features] = torch.randn(count, config.features, generator=generator)
    return inputs, (inputs[:, : config.features] @ rule > 0).long()


def canary_data(config: CanaryDataConfig, members: Tensor) -> DataBundle:
    """Public samples first, then the m canary slots (member k: scale * e_(features + k); else zeros), label 0."""
    generator = torch.Generator().manual_seed(config.data_seed)
    rule = torch.randn(config.features, generator=generator)
    real, labels = _real_samples(config.real_size, rule, config, generator)
    slots = torch.zeros(config.canaries, config.features + config.canaries)
    slots[:, config.features :] = torch.diag(members.float() * config.scale)
    test, test_labels = _real_samples(config.test_size, rule, config, generator)
    train = TensorSplit(torch.cat([real, slots]), torch.cat([labels, torch.zeros(config.canaries, dtype=torch.long)]))
    return DataBundle(DATA_NAME, train, TensorSplit(test, test_labels), num_classes=2, source="one-run audit")


class IterateRecorder:
    """The canary columns of the weight after every optimizer step (what the white-box attacker observes)."""

    def __init__(self, features: int):
        self.features = features
        self.model: nn.Linear | None = None
        self.iterates: list[Tensor] = []

    def build(self, config: LinearModelConfig, data: DataBundle) -> nn.Module:
        model = nn.Linear(data.train.features.shape[1], data.num_classes, bias=False)
        nn.init.zeros_(model.weight)
        self.model = model
        self.iterates = [self._columns()]
        return model

    def _columns(self) -> Tensor:
        return self.model.weight.detach()[:, self.features :].clone()

    def after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.model is not None and any(p is self.model.weight for g in optimizer.param_groups for p in g["params"]):
            self.iterates.append(self._columns())


@contextmanager
def _registered(members: Tensor, recorder: IterateRecorder) -> Iterator[None]:
    DATASETS[DATA_NAME] = Component(lambda config: canary_data(config, members), CanaryDataConfig)
    MODELS[MODEL_NAME] = Component(recorder.build, LinearModelConfig)
    handle = register_optimizer_step_post_hook(recorder.after_step)
    try:
        yield
    finally:
        handle.remove()
        del DATASETS[DATA_NAME], MODELS[MODEL_NAME]


@dataclass(frozen=True)
class CanaryRun:
    published: dict[str, Any]
    """results.json as the run wrote it: what everyone may read."""
    iterates: Tensor
    """(steps + 1, 2, m): the canary columns of the weight at initialisation and after every step."""


def train(cfg: DictConfig, run_dir: Path, members: Tensor) -> CanaryRun:
    """One real run of `cfg` (a canary config) with the given member slots."""
    recorder = IterateRecorder(int(cfg.data.features))
    with _registered(members, recorder):
        run_experiment(cfg, run_dir)
    published = read_results(run_dir).to_json()
    return CanaryRun(published, torch.stack(recorder.iterates))
