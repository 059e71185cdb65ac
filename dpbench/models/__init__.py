"""Models by name (`model=...`) or `_target_`: builders `(config: Schema, data: DataBundle) -> nn.Module`, each
declaring its dataclass schema, built for the data set's shape (see dpbench.core.registry)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from dpbench.core.errors import ConfigurationError
from dpbench.core.registry import Registry, options
from dpbench.data import DataBundle
from dpbench.models.cnn import CNNConfig, LargeCNN, LargeCNNConfig, TFPrivacyCNN
from dpbench.models.lstm import LSTMClassifier, LSTMConfig
from dpbench.models.provenance import built_by_dpbench


def _image_shape(data: DataBundle, model_name: str) -> tuple[int, int]:
    if data.input_shape is None or len(data.input_shape) != 3:
        raise ConfigurationError(f"model={model_name} needs image data (C, H, W); data={data.name} is not")
    channels, height, _ = data.input_shape
    return channels, height


def build_cnn(config: CNNConfig, data: DataBundle) -> nn.Module:
    channels, size = _image_shape(data, "cnn")
    return TFPrivacyCNN(channels, data.num_classes, size, config.activation, config.padding)


def build_cnn_large(config: LargeCNNConfig, data: DataBundle) -> nn.Module:
    channels, size = _image_shape(data, "cnn_large")
    return LargeCNN(
        channels, data.num_classes, size, config.width, config.hidden, config.activation, config.normalization
    )


def build_lstm(config: LSTMConfig, data: DataBundle) -> nn.Module:
    if data.vocab_size is None or not isinstance(data.train.features, torch.Tensor):
        raise ConfigurationError(f"model=lstm needs word-id data (e.g. data=rotten_tomatoes); data={data.name} is not")
    return LSTMClassifier(data.vocab_size, data.num_classes, config)


MODELS = Registry("model", "dpbench.models")
"""Model builders by name: dpbench's own and installed plugins' (entry point group `dpbench.models`)."""


TESTED_ARCHITECTURES = frozenset({"bert", "distilbert", "gpt2", "opt", "roberta", "vit"})
"""Hugging Face model types whose per-sample gradients dpbench's tests check against per-example passes; a
checkpoint of another architecture (`model.pretrained`) runs on the vmap engine (see per_sample.construction)."""


def _proven(model: nn.Module) -> bool:
    """Every Hugging Face model inside is of an architecture dpbench tests."""
    types = {getattr(module.config, "model_type", None) for module in model.modules() if hasattr(module, "config")
             and hasattr(module, "base_model_prefix")}
    return types <= TESTED_ARCHITECTURES


def build_model(config: DictConfig | Mapping[str, Any], data: DataBundle) -> nn.Module:
    """The model a `model` config node names (by `name` or `_target_`), built for `data`; one of dpbench's own
    builders' models is recorded as proven per-sample (per_sample.construction), a plugin's is not."""
    builder = MODELS.resolve(options(config))[0].factory
    model = MODELS.build(config, data)
    if not isinstance(model, nn.Module):
        raise ConfigurationError(f"the model builder for {options(config).get('name')!r} returned "
                                 f"{type(model).__name__}, not a torch.nn.Module")
    if getattr(builder, "__module__", "").startswith("dpbench.models") and _proven(model):
        built_by_dpbench(model)
    return model
