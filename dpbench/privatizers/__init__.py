"""Privatizer strategies by name: one file per strategy, one dataclass schema per strategy config (its `config`
annotation); see dpbench.core.registry for how a name or a `_target_` finds one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig

from dpbench.core.config import MIXED_PRECISION
from dpbench.core.registry import Registry
from dpbench.privatizers.base import PrivacySettings, PrivatizerStrategy, StepContext, StepOutput
from dpbench.privatizers.contract import check_contract
from dpbench.privatizers.per_sample.precision import unsupported_mixed_precision
from dpbench.privatizers.sharding import unsupported_sharding

STRATEGIES = Registry("privatizer", "dpbench.privatizers")
"""Privatizers by name: dpbench's own and installed plugins' (entry point group `dpbench.privatizers`)."""


def mixed_precision_privatizers() -> list[str]:
    """The privatizers whose steps run at bf16-mixed (their `supports_mixed_precision`)."""
    return sorted(name for name, found in STRATEGIES.items()
                  if getattr(found.factory, "supports_mixed_precision", False))


def check_strategy_precision(strategy: PrivatizerStrategy, precision: str) -> None:
    """Refuse bf16-mixed for a privatizer that does not widen what it forms (before any data is trained on)."""
    if precision == MIXED_PRECISION and not strategy.supports_mixed_precision:
        raise unsupported_mixed_precision(strategy.name, tuple(mixed_precision_privatizers()))


def check_strategy_sharding(strategy: PrivatizerStrategy, trainer_strategy: str) -> None:
    """Refuse trainer.strategy=fsdp for a privatizer that cannot shard (before any process is launched)."""
    if trainer_strategy == "fsdp" and not strategy.supports_sharding:
        raise unsupported_sharding(strategy.name)


def make_strategy(config: DictConfig | Mapping[str, Any], privacy: PrivacySettings) -> PrivatizerStrategy:
    """The strategy a `privatizer` config node names (by `name` or `_target_`), checked against its contract."""
    strategy = STRATEGIES.build(config, privacy)
    check_contract(strategy)
    return strategy


__all__ = ["PrivacySettings", "PrivatizerStrategy", "STRATEGIES", "StepContext", "StepOutput",
           "check_strategy_precision", "check_strategy_sharding", "make_strategy", "mixed_precision_privatizers"]
