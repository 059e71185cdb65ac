"""Models by name (`model=...`), each with a dataclass schema, built for the data set's shape."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from dpbench.config import validated
from dpbench.data import DataBundle
from dpbench.errors import ConfigurationError
from dpbench.models.cnn import CNNConfig, LargeCNN, LargeCNNConfig, TFPrivacyCNN
from dpbench.models.hf import TextTransformerConfig, ViTModelConfig, build_minilm, build_opt, build_roberta, build_vit
from dpbench.models.lstm import LSTMClassifier, LSTMConfig
from dpbench.models.word2vec import Word2VecConfig, build_word2vec


def _image_shape(data: DataBundle, model_name: str) -> tuple[int, int]:
    if data.input_shape is None or len(data.input_shape) != 3:
        raise ConfigurationError(f"model={model_name} needs image data (C, H, W); data={data.name} is not")
    channels, height, _ = data.input_shape
    return channels, height


def _cnn(config: CNNConfig, data: DataBundle) -> nn.Module:
    channels, size = _image_shape(data, "cnn")
    return TFPrivacyCNN(channels, data.num_classes, size, config.activation)


def _cnn_large(config: LargeCNNConfig, data: DataBundle) -> nn.Module:
    channels, size = _image_shape(data, "cnn_large")
    return LargeCNN(
        channels, data.num_classes, size, config.width, config.hidden, config.activation, config.normalization
    )


def _lstm(config: LSTMConfig, data: DataBundle) -> nn.Module:
    if data.vocab_size is None or not isinstance(data.train.features, torch.Tensor):
        raise ConfigurationError(f"model=lstm needs word-id data (e.g. data=rotten_tomatoes); data={data.name} is not")
    return LSTMClassifier(data.vocab_size, data.num_classes, config)


MODELS: dict[str, tuple[type, Callable[[Any, DataBundle], nn.Module]]] = {
    "cnn": (CNNConfig, _cnn),
    "cnn_large": (LargeCNNConfig, _cnn_large),
    "lstm": (LSTMConfig, _lstm),
    "vit": (ViTModelConfig, build_vit),
    "roberta": (TextTransformerConfig, build_roberta),
    "opt": (TextTransformerConfig, build_opt),
    "minilm": (TextTransformerConfig, build_minilm),
    "word2vec": (Word2VecConfig, build_word2vec),
}


def build_model(config: DictConfig, data: DataBundle) -> nn.Module:
    name = config.get("name")
    if name not in MODELS:
        raise ConfigurationError(f"unknown model {name!r}; choose one of {sorted(MODELS)}")
    schema, builder = MODELS[name]
    return builder(validated(schema, config, "model"), data)
