"""In-memory tensors of a data set split, fetched a whole batch at a time."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.utils.data import Dataset

from dpbench.core.errors import ConfigurationError, MissingDataError
from dpbench.core.tasks import ClassificationTask, Task


class TensorSplit(Dataset):
    """Features (a tensor or dict of tensors) and integer targets; __getitems__ indexes a batch in one go."""

    def __init__(self, features: Tensor | dict[str, Tensor], targets: Tensor):
        self.features = features
        self.targets = targets

    def __len__(self) -> int:
        return int(self.targets.shape[0])

    def _take(self, index: Tensor):
        if isinstance(self.features, dict):
            return {key: value[index] for key, value in self.features.items()}, self.targets[index]
        return self.features[index], self.targets[index]

    def __getitem__(self, index: int):
        return self._take(torch.tensor([index]))

    def __getitems__(self, indices: list[int]):
        return self._take(torch.as_tensor(indices, dtype=torch.long))


def identity_collate(batch):
    """__getitems__ already returns the batch."""
    return batch


@dataclass
class DataBundle:
    name: str
    train: TensorSplit
    test: TensorSplit
    num_classes: int
    input_shape: tuple[int, ...] | None = None
    """(C, H, W) for images; None for token data."""
    vocab_size: int | None = None
    source: str = ""
    task: Task = field(default_factory=ClassificationTask)
    """The loss and metric this data is trained and tested with."""
    validation: TensorSplit | None = None
    """Carved from the training data when data.validation_size is set (for tuning); else evaluation uses test."""
    input_transform: str | None = None
    """What replaced the raw inputs (replace_inputs), e.g. a model's fixed scattering stage; None: raw inputs."""

    def __post_init__(self) -> None:
        if len(self.train) == 0:
            raise MissingDataError(f"data set {self.name!r} has an empty training split")
        if len(self.test) == 0:
            raise MissingDataError(f"data set {self.name!r} has an empty test split")

    def replace_inputs(
        self, transform: Callable[[Tensor], Tensor], input_shape: tuple[int, ...], description: str
    ) -> None:
        """Swap every split's inputs for transform(inputs), once: a model's fixed first stage (no parameters, one
        output per sample, e.g. scattering) computed ahead of training instead of at every step. A record still maps
        to one record, so the privacy guarantee is the one of training on the raw inputs. A second replacement is
        refused: its transform would be fed the first one's output."""
        if self.input_transform is not None:
            raise ConfigurationError(f"data {self.name!r} already holds {self.input_transform}, not raw inputs: "
                                     f"load it again for {description}")
        for split in (self.train, self.test, self.validation):
            if split is not None:
                split.features = transform(split.features)
        self.input_shape, self.input_transform = input_shape, description
