"""Hydra set up for dpbench as `python -m dpbench` has it: the conf dir, the config schemas and every plugin's config
group. Nothing happens on import: `setup()` registers (once per process), and every command and library entry that
composes a config calls it first."""

from __future__ import annotations

import argparse
import functools
import os
from pathlib import Path

from hydra._internal.hydra import Hydra
from hydra._internal.utils import create_automatic_config_search_path
from hydra.core.config_search_path import SearchPathQuery
from omegaconf import DictConfig

from dpbench.core.config import register_schemas
from dpbench.core.errors import ConfigurationError
from dpbench.core.registry import Registry

CALLING_MODULE = "dpbench.cli"
"""The module whose `@hydra.main` a run starts from: relative `--config-path`s resolve against it."""


def config_dir() -> str:
    """conf/ at the top of a checkout, or dpbench/conf inside an installed wheel."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package / "conf", package.parent / "conf"):
        if (candidate / "config.yaml").exists():
            return str(candidate)
    raise FileNotFoundError("dpbench's conf/ directory was not found beside the package")


def registries() -> tuple[Registry, Registry, Registry]:
    from dpbench.data import DATASETS
    from dpbench.models import MODELS
    from dpbench.privatizers import STRATEGIES

    return STRATEGIES, MODELS, DATASETS


def register_config_groups(config_dir: str) -> None:
    """Make every entry point a Hydra config group option (`privatizer=my_method`) holding its schema's defaults.

    Names with a yaml file in `config_dir` (dpbench's presets, e.g. conf/privatizer/vanilla.yaml) are left to the
    file: Hydra would otherwise validate the file against the stored node. An entry point that fails to import is
    skipped here and reported when a config asks for it.
    """
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for registry in registries():
        for name in registry._entry_points:
            if (Path(config_dir) / registry.group / f"{name}.yaml").exists():
                continue
            try:
                node = registry.defaults(name)
            except ConfigurationError:
                continue
            store.store(group=registry.group, name=name, node=node)


@functools.cache
def setup() -> None:
    """The schemas and every plugin's config group in Hydra's config store, once per process."""
    register_schemas()
    register_config_groups(config_dir())


def main_hydra(args: argparse.Namespace) -> Hydra:
    """Hydra set up as `@hydra.main` sets it up for dpbench.cli.main (`args`: config_path, config_dir)."""
    setup()
    config_path = args.config_path if args.config_path is not None else config_dir()
    search_path = create_automatic_config_search_path(None, CALLING_MODULE, config_path)
    if args.config_dir is not None:
        directory = os.path.abspath(args.config_dir)
        if not os.path.isdir(directory):
            raise ConfigurationError(f"--config-dir {directory} does not exist")
        search_path.prepend("command-line", f"file://{directory}", anchor=SearchPathQuery(provider="schema"))
    return Hydra.create_main_hydra2(task_name="dpbench", config_search_path=search_path)


def compose(overrides: list[str] | tuple[str, ...] = (), config_name: str = "config") -> DictConfig:
    """The config `python -m dpbench OVERRIDES` composes (dpbench's conf dir, schemas and plugins), without a run:
    for library code that plans, audits or tunes runs."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    setup()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=list(overrides))
