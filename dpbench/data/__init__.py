"""Data sets by name (`data=...`): embedded offline defaults, and Hugging Face hub names for users online."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from omegaconf import DictConfig

from dpbench.config import validated
from dpbench.data.bundle import DataBundle, TensorSplit, identity_collate
from dpbench.data.images import ImageDataConfig, digits, fashion_mnist, hub_images, mnist5k
from dpbench.errors import MissingDataError

DATASETS: dict[str, tuple[type, Callable[[Any], DataBundle]]] = {
    "mnist5k": (ImageDataConfig, mnist5k),
    "digits": (ImageDataConfig, digits),
    "fashion_mnist": (ImageDataConfig, fashion_mnist),
    "mnist": (ImageDataConfig, hub_images),
    "cifar10": (ImageDataConfig, hub_images),
    "cifar100": (ImageDataConfig, hub_images),
    "hub_images": (ImageDataConfig, hub_images),
}


def load_data(config: DictConfig) -> DataBundle:
    name = config.get("name")
    if name not in DATASETS:
        raise MissingDataError(f"unknown data set {name!r}; choose one of {sorted(DATASETS)}")
    schema, loader = DATASETS[name]
    settings = validated(schema, config, "data")
    bundle = loader(settings)
    cap = getattr(settings, "train_size", None)
    if cap is not None:
        order = torch.randperm(len(bundle.train), generator=torch.Generator().manual_seed(1))[:cap]
        bundle.train = TensorSplit(*bundle.train.__getitems__(order.tolist()))
        bundle.__post_init__()
    return bundle


__all__ = ["DATASETS", "DataBundle", "TensorSplit", "identity_collate", "load_data"]
