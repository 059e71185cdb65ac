"""dpbench: experiment runner and benchmark harness for differentially private training, and a library.

The public API, imported on first use (`import dpbench` stays light for the CLI):

- `PrivatizerStrategy` (with `PrivacySettings`, `StepContext`, `StepOutput`): the interface a method implements.
  Its contract with the accountant: `composition(sigma, steps)` returns a non-empty list of (`Mechanism`, count)
  pairs that upper-bounds every release of a `steps`-step run at base noise multiplier sigma, and
  `step_mechanisms(step)` the mechanisms of one step, the same ones; a strategy that breaks it is refused before
  training. `SubsampledGaussian(q, sigma)` is the default step: N(0, (sigma C)^2) added to a sum of contributions
  each clipped to C, over a Poisson sample at rate q.
- `Task` (with `ClassificationTask`): the per-sample loss vector every privatizer starts from, and the test metric.
- `make_private` / `poisson_loader` / `PrivateTraining`: a privatizer in a plain PyTorch loop.
- `make_private_module` / `PrivateModule` (a `DPModule`): a privatizer under your own Lightning Trainer.
- `epsilon(composition, delta)` / `calibrate(composition_for, target_epsilon, delta)`: the accountant.
- `DataBundle` / `TensorSplit`, `OptimizerConfig`, `ConfigurationError`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "PrivatizerStrategy": "dpbench.privatizers.base",
    "PrivacySettings": "dpbench.privatizers.base",
    "StepContext": "dpbench.privatizers.base",
    "StepOutput": "dpbench.privatizers.base",
    "Mechanism": "dpbench.privacy.mechanisms",
    "SubsampledGaussian": "dpbench.privacy.mechanisms",
    "Composition": "dpbench.privacy.mechanisms",
    "EpsilonReport": "dpbench.privacy.accountant",
    "Task": "dpbench.core.tasks",
    "ClassificationTask": "dpbench.core.tasks",
    "Batch": "dpbench.core.tasks",
    "DataBundle": "dpbench.data.bundle",
    "TensorSplit": "dpbench.data.bundle",
    "OptimizerConfig": "dpbench.core.optim",
    "ConfigurationError": "dpbench.core.errors",
    "make_private": "dpbench.training.private_loop",
    "poisson_loader": "dpbench.training.private_loop",
    "PrivateTraining": "dpbench.training.private_loop",
    "PrivacySpent": "dpbench.training.private_loop",
    "make_private_module": "dpbench.training.private_loop",
    "PrivateModule": "dpbench.training.private_loop",
    "DPModule": "dpbench.training.module",
    "epsilon": "dpbench.privacy.accounting",
    "calibrate": "dpbench.privacy.accounting",
}

__all__ = [
    "Batch", "ClassificationTask", "Composition", "ConfigurationError", "DPModule", "DataBundle", "EpsilonReport",
    "Mechanism", "OptimizerConfig", "PrivacySettings", "PrivacySpent", "PrivateModule", "PrivateTraining",
    "PrivatizerStrategy", "StepContext", "StepOutput", "SubsampledGaussian", "Task", "TensorSplit", "calibrate",
    "epsilon", "make_private", "make_private_module", "poisson_loader",
]

if TYPE_CHECKING:
    from dpbench.core.errors import ConfigurationError
    from dpbench.core.optim import OptimizerConfig
    from dpbench.core.tasks import Batch, ClassificationTask, Task
    from dpbench.data.bundle import DataBundle, TensorSplit
    from dpbench.privacy.accountant import EpsilonReport
    from dpbench.privacy.accounting import calibrate, epsilon
    from dpbench.privacy.mechanisms import Composition, Mechanism, SubsampledGaussian
    from dpbench.privatizers.base import PrivacySettings, PrivatizerStrategy, StepContext, StepOutput
    from dpbench.training.module import DPModule
    from dpbench.training.private_loop import (
        PrivacySpent,
        PrivateModule,
        PrivateTraining,
        make_private,
        make_private_module,
        poisson_loader,
    )


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dpbench' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
