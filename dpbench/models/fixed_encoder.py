"""model.cached_features: a private head on a frozen pretrained encoder, trained on the encoder's mean-pooled
features, computed once per data split and cached on disk (dpbench.models.feature_cache).

With the encoder fixed (model.freeze covering the whole base model, LoRA adapters included) it runs as in evaluation,
dropout off (see SequenceClassifier), so each sentence's pooled features are a function of that sentence alone: the
head trained on them is the head inside the full network, with the same per-sample gradients, without a pass through
the encoder at every step (MiniLM's 22.7M fixed parameters in front of a 770-parameter head).
"""

from __future__ import annotations

import hashlib
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from dpbench.core.errors import ConfigurationError
from dpbench.data.bundle import DataBundle
from dpbench.models.feature_cache import cached, default_cache_dir, tensor_bytes

CHUNK = 256
"""Sentences per encoder call while the features are computed."""


class PooledHead(nn.Module):
    """(B, hidden) pooled features -> dropout -> linear classifier: the part of a SequenceClassifier that trains."""

    def __init__(self, dropout: nn.Module | None, classifier: nn.Linear):
        super().__init__()
        self.dropout = dropout if isinstance(dropout, nn.Module) else nn.Identity()
        self.classifier = classifier

    def forward(self, pooled: Tensor) -> Tensor:
        return self.classifier(self.dropout(pooled))


def weights_digest(module: nn.Module) -> str:
    """A digest of every parameter and buffer: what fixes the encoder's features."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor_bytes(tensor))
    return digest.hexdigest()[:16]


def pooled_features(classifier: Any, inputs: dict[str, Tensor]) -> Tensor:
    """(N, hidden) mean-pooled last hidden states of `classifier`'s encoder (in evaluation mode), CHUNK at a time."""
    training = classifier.training
    classifier.eval()
    try:
        with torch.no_grad():
            count = len(next(iter(inputs.values())))
            return torch.cat([classifier.pooled({key: value[start : start + CHUNK] for key, value in inputs.items()})
                              for start in range(0, count, CHUNK)])
    finally:
        classifier.train(training)


def head_on_cached_features(classifier: Any, data: DataBundle, pretrained: str) -> PooledHead:
    """The classifier's head, after replacing the data's token ids by the fixed encoder's (cached) pooled features;
    `classifier` is a dpbench.models.hf.SequenceClassifier."""
    if classifier.pooling != "mean":
        raise ConfigurationError(
            "model.cached_features=true caches the mean-pooled features: set model.pooling=mean (the [CLS] pooler "
            "of model.pooling=model is not cached)"
        )
    base = classifier.model.base_model
    training = [name for name, param in base.named_parameters() if param.requires_grad]
    if training:
        raise ConfigurationError(
            f"model.cached_features=true needs the encoder fixed, but {len(training)} of its parameters train (e.g. "
            f"{training[0]}): set model.freeze=[{classifier.model.base_model_prefix}] without model.lora.rank, or "
            "drop model.cached_features"
        )
    digest = weights_digest(base)
    description = f"mean-pooled features of the fixed {pretrained} encoder ({digest})"
    if data.input_transform != description:
        if not isinstance(data.train.features, dict):
            raise ConfigurationError("model.cached_features=true needs text tokenized by the encoder's tokenizer: set "
                                     "data.tokenizer to ${model.tokenizer} (e.g. data.tokenizer=hf:minilm)")
        hidden = classifier.model.config.hidden_size
        compute = partial(cached, stage=description, compute=partial(pooled_features, classifier), shape=(hidden,),
                          cache_dir=default_cache_dir("encoder_features"), what="pooled encoder features")
        data.replace_inputs(compute, (hidden,), description)
    return PooledHead(getattr(classifier.model, "dropout", None), classifier.model.classifier).train()
