"""Privatizer strategies by name: one file per strategy, one dataclass schema per strategy config."""

from __future__ import annotations

from omegaconf import DictConfig

from dpbench.config import validated
from dpbench.errors import ConfigurationError
from dpbench.privatizers.base import PrivacySettings, PrivatizerStrategy, StepContext, StepOutput
from dpbench.privatizers.nonprivate import NonPrivate, NonPrivateConfig
from dpbench.privatizers.vanilla import Vanilla, VanillaConfig

STRATEGIES: dict[str, tuple[type[PrivatizerStrategy], type]] = {
    "nonprivate": (NonPrivate, NonPrivateConfig),
    "vanilla": (Vanilla, VanillaConfig),
}


def make_strategy(config: DictConfig, privacy: PrivacySettings) -> PrivatizerStrategy:
    name = config.get("name")
    if name not in STRATEGIES:
        raise ConfigurationError(f"unknown privatizer {name!r}; choose one of {sorted(STRATEGIES)}")
    strategy_class, schema = STRATEGIES[name]
    return strategy_class(validated(schema, config, "privatizer"), privacy)


__all__ = ["PrivacySettings", "PrivatizerStrategy", "STRATEGIES", "StepContext", "StepOutput", "make_strategy"]
