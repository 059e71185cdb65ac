"""Privatizer strategies by name: one file per strategy, one dataclass schema per strategy config (its `config`
annotation); see dpbench.core.registry for how a name or a `_target_` finds one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig

from dpbench.core.registry import Registry
from dpbench.privatizers.base import PrivacySettings, PrivatizerStrategy, StepContext, StepOutput
from dpbench.privatizers.contract import check_contract

STRATEGIES = Registry("privatizer", "dpbench.privatizers")
"""Privatizers by name: dpbench's own and installed plugins' (entry point group `dpbench.privatizers`)."""


def make_strategy(config: DictConfig | Mapping[str, Any], privacy: PrivacySettings) -> PrivatizerStrategy:
    """The strategy a `privatizer` config node names (by `name` or `_target_`), checked against its contract."""
    strategy = STRATEGIES.build(config, privacy)
    check_contract(strategy)
    return strategy


__all__ = ["PrivacySettings", "PrivatizerStrategy", "STRATEGIES", "StepContext", "StepOutput", "make_strategy"]
