"""model.trainable_layers: fine-tune only the top transformer layers of a pretrained BERT-style encoder (and the head),
optionally on the fixed lower layers' hidden states, computed once per data split and cached (model.cached_features).

Training the top layers gives the projection methods real matrices to project (MiniLM's 384 x 1536 feed-forward
weights), while the fixed embeddings and lower layers, run as in evaluation (dropout off), map each sentence to its
own hidden states: the top layers trained on them are the top layers inside the full network, with the same
per-sample gradients, without a pass through the lower layers at every step. The cache holds one tensor per split,
so each sentence's attention mask travels with its hidden states as one extra channel.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from dpbench.core.errors import ConfigurationError
from dpbench.data.bundle import DataBundle
from dpbench.models.feature_cache import cached, default_cache_dir
from dpbench.models.fixed_encoder import CHUNK, weights_digest


def fixed_modules_to_eval(model: nn.Module) -> None:
    """Modules whose parameters are all fixed run as in evaluation (dropout off): fixed layers give fixed outputs."""
    for module in model.modules():
        parameters = list(module.parameters())
        if parameters and not any(param.requires_grad for param in parameters):
            module.eval()


def encoder_layers(model: nn.Module) -> nn.ModuleList:
    """The transformer layers of a BERT-style encoder (base_model.encoder.layer); other architectures are refused."""
    layers = getattr(getattr(model.base_model, "encoder", None), "layer", None)
    if not isinstance(layers, nn.ModuleList):
        raise ConfigurationError(f"model.trainable_layers needs a BERT-style encoder (base_model.encoder.layer); "
                                 f"{type(model).__name__} has none: drop model.trainable_layers")
    return layers


def top_layer_indices(model: nn.Module, count: int | None) -> list[int] | None:
    """Indices of the top `count` layers (None: every layer trains), refused outside 1 .. the number of layers."""
    if count is None:
        return None
    total = len(encoder_layers(model))
    if not 1 <= count <= total:
        raise ConfigurationError(f"model.trainable_layers must be between 1 and {total} (the encoder's layers), "
                                 f"got {count}")
    return list(range(total - count, total))


def lower_prefixes(model: nn.Module, count: int | None) -> list[str]:
    """Parameter-name prefixes of the embeddings and the layers below the top `count`: what model.freeze adds."""
    top = top_layer_indices(model, count)
    if top is None:
        return []
    prefix = model.base_model_prefix
    return [f"{prefix}.embeddings", *(f"{prefix}.encoder.layer.{index}" for index in range(top[0]))]


class TopLayersHead(nn.Module):
    """(B, T, hidden + 1) cached hidden states with the attention mask as last channel -> the top layers -> the masked
    mean over real tokens -> dropout -> linear classifier: the part of a SequenceClassifier that trains."""

    def __init__(self, layers: nn.ModuleList, config: Any, dropout: nn.Module | None, classifier: nn.Linear):
        super().__init__()
        self.layers = layers
        self.config = config
        self.dropout = dropout if isinstance(dropout, nn.Module) else nn.Identity()
        self.classifier = classifier

    def train(self, mode: bool = True) -> TopLayersHead:
        super().train(mode)
        if mode:
            fixed_modules_to_eval(self)
        return self

    def forward(self, states: Tensor) -> Tensor:
        from transformers.masking_utils import create_bidirectional_mask

        hidden, mask = states[..., :-1], states[..., -1]
        attention = create_bidirectional_mask(config=self.config, inputs_embeds=hidden, attention_mask=mask.long())
        for layer in self.layers:
            hidden = layer(hidden, attention)
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
        return self.classifier(self.dropout(pooled))


def lower_states(classifier: Any, inputs: dict[str, Tensor], cut: int) -> Tensor:
    """(N, T, hidden + 1): the hidden states entering layer `cut` (evaluation mode), the attention mask appended."""
    training = classifier.training
    classifier.eval()
    try:
        with torch.no_grad():
            count = len(next(iter(inputs.values())))
            return torch.cat([_chunk_states(classifier, {key: value[start: start + CHUNK] for key, value in
                                                         inputs.items()}, cut) for start in range(0, count, CHUNK)])
    finally:
        classifier.train(training)


def _chunk_states(classifier: Any, inputs: dict[str, Tensor], cut: int) -> Tensor:
    """The embeddings and layers below `cut` run one by one as BertModel runs them (not through its
    output_hidden_states, which leaves recording hooks on every layer that the per-sample engines refuse)."""
    from transformers.masking_utils import create_bidirectional_mask

    base = classifier.model.base_model
    ids = inputs["input_ids"]
    positions = torch.arange(ids.shape[1]).expand(*ids.shape) if classifier.explicit_positions else None
    hidden = base.embeddings(input_ids=ids, token_type_ids=inputs.get("token_type_ids"), position_ids=positions)
    mask = inputs.get("attention_mask", torch.ones_like(ids))
    attention = create_bidirectional_mask(config=base.config, inputs_embeds=hidden, attention_mask=mask)
    for layer in encoder_layers(classifier.model)[:cut]:
        hidden = layer(hidden, attention)
    return torch.cat([hidden, mask.to(hidden.dtype).unsqueeze(-1)], dim=-1)


def top_layers_on_cached_states(classifier: Any, data: DataBundle, pretrained: str, count: int) -> TopLayersHead:
    """The top `count` layers and head, after replacing the data's token ids by the fixed lower layers' (cached)
    hidden states; `classifier` is a dpbench.models.hf.SequenceClassifier whose lower part model.freeze fixed."""
    if classifier.pooling != "mean":
        raise ConfigurationError("model.cached_features=true with model.trainable_layers reads the top layers' mean-"
                                 "pooled output: set model.pooling=mean")
    model = classifier.model
    layers = encoder_layers(model)
    cut = len(layers) - count
    lower = nn.ModuleList([model.base_model.embeddings, *layers[:cut]])
    if any(param.requires_grad for param in lower.parameters()):
        raise ConfigurationError("model.cached_features=true caches the fixed lower layers, but some of their "
                                 "parameters train: drop model.lora from them or model.cached_features")
    description = (f"hidden states entering layer {cut} of the fixed {pretrained} encoder ({weights_digest(lower)}), "
                   "attention mask last")
    if data.input_transform != description:
        if not isinstance(data.train.features, dict):
            raise ConfigurationError("model.cached_features=true needs text tokenized by the encoder's tokenizer: set "
                                     "data.tokenizer to ${model.tokenizer} (e.g. data.tokenizer=hf:minilm)")
        shape = (data.train.features["input_ids"].shape[1], model.config.hidden_size + 1)
        compute = partial(cached, stage=description, compute=partial(lower_states, classifier, cut=cut), shape=shape,
                          cache_dir=default_cache_dir("encoder_features"), what="lower-layer hidden states")
        data.replace_inputs(compute, shape, description)
    top = nn.ModuleList(layers[cut:])
    return TopLayersHead(top, model.config, getattr(model, "dropout", None), model.classifier).train()
