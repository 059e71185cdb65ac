"""Privatizer strategies by name: one file per strategy, one dataclass schema per strategy config."""

from __future__ import annotations

from omegaconf import DictConfig

from dpbench.config import validated
from dpbench.errors import ConfigurationError
from dpbench.privatizers.base import PrivacySettings, PrivatizerStrategy, StepContext, StepOutput
from dpbench.privatizers.d2p2 import D2P2, D2PSGD, DP2SGD, D2P2Config, D2PSGDConfig, DP2SGDConfig
from dpbench.privatizers.dp_galore import DPGaLore, DPGaLoreConfig
from dpbench.privatizers.grape import Grape, GrapeConfig
from dpbench.privatizers.jl import JL, JLConfig
from dpbench.privatizers.nonprivate import NonPrivate, NonPrivateConfig
from dpbench.privatizers.sparse import Sparse, SparseConfig
from dpbench.privatizers.vanilla import Vanilla, VanillaConfig

STRATEGIES: dict[str, tuple[type[PrivatizerStrategy], type]] = {
    "nonprivate": (NonPrivate, NonPrivateConfig),
    "vanilla": (Vanilla, VanillaConfig),
    "grape": (Grape, GrapeConfig),
    "dp_galore": (DPGaLore, DPGaLoreConfig),
    "jl": (JL, JLConfig),
    "sparse": (Sparse, SparseConfig),
    "d2p2": (D2P2, D2P2Config),
    "d2p_sgd": (D2PSGD, D2PSGDConfig),
    "dp2_sgd": (DP2SGD, DP2SGDConfig),
}


def make_strategy(config: DictConfig, privacy: PrivacySettings) -> PrivatizerStrategy:
    name = config.get("name")
    if name not in STRATEGIES:
        raise ConfigurationError(f"unknown privatizer {name!r}; choose one of {sorted(STRATEGIES)}")
    strategy_class, schema = STRATEGIES[name]
    return strategy_class(validated(schema, config, "privatizer"), privacy)


__all__ = ["PrivacySettings", "PrivatizerStrategy", "STRATEGIES", "StepContext", "StepOutput", "make_strategy"]
