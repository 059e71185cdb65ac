"""Published shapes of the GRAPE paper's three model families (OPT, RoBERTa, ViT), for `model.size`.

Each entry copies the architecture keys of the checkpoint's config.json on the Hugging Face hub, in the keyword
names of the transformers config class, so that a model built from it (random weights, nothing downloaded) has the
published model's layers and parameter count, vocabulary included, whatever tokenizer feeds it. The dropouts are the
published ones too; the model config's own dropout keys still apply on top (see dpbench.models.hf).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpbench.core.errors import ConfigurationError


@dataclass(frozen=True)
class PublishedShape:
    checkpoint: str
    """The hub checkpoint whose config.json `config` copies."""
    config: dict[str, Any]
    """Keyword arguments of the family's transformers config class (OPTConfig, RobertaConfig, ViTConfig)."""


def _opt(size: str, hidden: int, layers: int, heads: int, embed: int | None = None, pre_norm: bool = True) -> \
        PublishedShape:
    """facebook/opt-SIZE: a ReLU decoder with 4x-wide feed-forward layers and the 50272-token GPT-2 BPE vocabulary."""
    return PublishedShape(f"facebook/opt-{size}", {
        "vocab_size": 50272, "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
        "ffn_dim": 4 * hidden, "max_position_embeddings": 2048, "word_embed_proj_dim": embed or hidden,
        "do_layer_norm_before": pre_norm, "activation_function": "relu", "dropout": 0.1, "attention_dropout": 0.0,
        "enable_bias": True, "layer_norm_elementwise_affine": True,
    })


def _roberta(name: str, hidden: int, layers: int, heads: int) -> PublishedShape:
    """roberta-NAME (FacebookAI): BERT's encoder with 514 positions (two offset by padding) and one token type."""
    return PublishedShape(f"FacebookAI/roberta-{name}", {
        "vocab_size": 50265, "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
        "intermediate_size": 4 * hidden, "max_position_embeddings": 514, "type_vocab_size": 1,
        "layer_norm_eps": 1e-5, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
    })


PUBLISHED: dict[str, dict[str, PublishedShape]] = {
    "opt": {
        "125m": _opt("125m", 768, 12, 12),
        # The odd one: 1024 wide inside, 512-wide embeddings (project_in / project_out) and post-layer norm.
        "350m": _opt("350m", 1024, 24, 16, embed=512, pre_norm=False),
        "1.3b": _opt("1.3b", 2048, 24, 32),
        "2.7b": _opt("2.7b", 2560, 32, 32),
        "6.7b": _opt("6.7b", 4096, 32, 32),
    },
    "roberta": {
        "base": _roberta("base", 768, 12, 12),
        "large": _roberta("large", 1024, 24, 16),
    },
    "vit": {
        "base": PublishedShape("google/vit-base-patch16-224", {
            "image_size": 224, "patch_size": 16, "num_channels": 3, "hidden_size": 768, "num_hidden_layers": 12,
            "num_attention_heads": 12, "intermediate_size": 3072, "hidden_act": "gelu", "layer_norm_eps": 1e-12,
            "qkv_bias": True, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
        }),
    },
}
"""Published shapes by family (the `model` name) and `model.size`."""


def published_shape(family: str, size: str) -> PublishedShape:
    """The shape `model=family model.size=size` names; an unknown size is refused with the known ones."""
    sizes = PUBLISHED.get(family, {})
    if size not in sizes:
        known = f"one of {', '.join(sizes)}" if sizes else "none (it has no published sizes here)"
        raise ConfigurationError(f"model.size={size!r} is not a published {family} shape; model={family} knows "
                                 f"{known}, or null for its small CPU config")
    return sizes[size]
