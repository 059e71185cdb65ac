"""Data sets by name (`data=...`) or `_target_`: loaders `(config: Schema) -> DataBundle`; embedded offline defaults,
and Hugging Face hub names for users online (see dpbench.core.registry)."""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from dpbench.core.errors import MissingDataError
from dpbench.core.registry import Registry, options
from dpbench.data.bundle import DataBundle, TensorSplit, identity_collate

DATASETS = Registry("data", "dpbench.data", error=MissingDataError)
"""Data loaders by name: dpbench's own and installed plugins' (entry point group `dpbench.data`)."""


def load_data(config: DictConfig | dict) -> DataBundle:
    """The data set named by config.name; `validation_size` (any data set) carves a validation split out of the
    training split, so that tuning never looks at the test split."""
    node = options(config)
    validation_size = int(node.pop("validation_size", 0) or 0)
    found, settings = DATASETS.validated(node)
    bundle = found.factory(settings)
    if not isinstance(bundle, DataBundle):
        raise MissingDataError(f"the data loader for {node.get('name')!r} returned {type(bundle).__name__}, "
                               "not a dpbench.DataBundle")
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
