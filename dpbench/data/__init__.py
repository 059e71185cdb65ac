"""Data sets by name (`data=...`): embedded offline defaults, and Hugging Face hub names for users online."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from dpbench.config import validated
from dpbench.data.bundle import DataBundle, TensorSplit, identity_collate
from dpbench.data.corpus import CorpusConfig, corpus_bundle
from dpbench.data.images import ImageDataConfig, digits, fashion_mnist, hub_images, mnist5k
from dpbench.data.text import TextDataConfig, text_data
from dpbench.errors import MissingDataError

DATASETS: dict[str, tuple[type, Callable[[Any], DataBundle]]] = {
    "mnist5k": (ImageDataConfig, mnist5k),
    "digits": (ImageDataConfig, digits),
    "fashion_mnist": (ImageDataConfig, fashion_mnist),
    "mnist": (ImageDataConfig, hub_images),
    "cifar10": (ImageDataConfig, hub_images),
    "cifar100": (ImageDataConfig, hub_images),
    "hub_images": (ImageDataConfig, hub_images),
    "rotten_tomatoes": (TextDataConfig, text_data),
    "imdb": (TextDataConfig, text_data),
    "sst2": (TextDataConfig, text_data),
    "bbc_news": (CorpusConfig, corpus_bundle),
    "brown": (CorpusConfig, corpus_bundle),
}


def load_data(config: DictConfig | dict) -> DataBundle:
    """The data set named by config.name; `validation_size` (any data set) carves a validation split out of the
    training split, so that tuning never looks at the test split."""
    options = OmegaConf.to_container(config, resolve=True) if isinstance(config, DictConfig) else dict(config)
    validation_size = int(options.pop("validation_size", 0) or 0)
    name = options.get("name")
    if name not in DATASETS:
        raise MissingDataError(f"unknown data set {name!r}; choose one of {sorted(DATASETS)}")
    schema, loader = DATASETS[name]
    settings = validated(schema, options, "data")
    bundle = loader(settings)
    cap = getattr(settings, "train_size", None)
    order = torch.randperm(len(bundle.train), generator=torch.Generator().manual_seed(1))
    if validation_size:
        if not 0 < validation_size < len(bundle.train):
            raise MissingDataError(f"data.validation_size={validation_size} must lie in (0, {len(bundle.train)})")
        bundle.validation = TensorSplit(*bundle.train.__getitems__(order[:validation_size].tolist()))
        order = order[validation_size:]
    if cap is not None or validation_size:
        bundle.train = TensorSplit(*bundle.train.__getitems__(order[:cap].tolist()))
        bundle.__post_init__()
    return bundle


__all__ = ["DATASETS", "DataBundle", "TensorSplit", "identity_collate", "load_data"]
