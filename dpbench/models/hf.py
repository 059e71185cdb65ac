"""Hugging Face transformers for image and sequence classification: ViT, RoBERTa, OPT and the pretrained MiniLM.

Each is built from a small config (CPU-sized defaults), from a published shape (`size`: OPT 125m ... 6.7b, RoBERTa
base / large, ViT-base; random weights, see dpbench.models.published) or loaded from `pretrained` (a hub name or
local path; offline unless the environment allows the hub). A wrapper maps dpbench batches (an image tensor, or a
dict of input_ids and attention_mask) to logits, and passes explicit per-sample position ids where a model would
otherwise broadcast one (1, T) row over the batch (which would hide per-sample gradients from the hook engine).
Text models may train peft LoRA adapters and their head only (model.lora, dpbench.models.lora).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpbench.core.errors import ConfigurationError
from dpbench.data.bundle import DataBundle
from dpbench.data.hf_checkpoints import load_pretrained, load_tokenizer
from dpbench.models.fixed_encoder import head_on_cached_features
from dpbench.models.lora import LoRAConfig, add_lora
from dpbench.models.published import PublishedShape, published_shape
from dpbench.models.top_layers import (
    fixed_modules_to_eval,
    lower_prefixes,
    top_layer_indices,
    top_layers_on_cached_states,
)

EXPLICIT_POSITIONS = {"bert", "distilbert", "gpt2"}
"""Model types that broadcast one (1, T) row of position ids over the batch unless given (B, T) ones."""


@dataclass
class ViTModelConfig:
    name: str = "vit"
    pretrained: str | None = None
    """Hub name or local path of a ViT checkpoint (images are resized to its size); null builds from the keys below."""
    size: str | None = None
    """`base`: ViT-B/16's published shape (224x224 images, resized to it; 3 channels) instead of the shape keys below,
    which must then keep their defaults; null: the small CPU config they describe."""
    patch_size: int = 7
    hidden_size: int = 64
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 128
    hidden_dropout: float = 0.0
    """Must be 0 for private training with hooks: dropout after the position embedding hides its per-sample grad."""
    attention_dropout: float = 0.0


@dataclass
class TextTransformerConfig:
    name: str = "roberta"
    pretrained: str | None = None
    """Hub name, local path or `minilm`; null builds from the keys below with the tokenizer's vocabulary."""
    size: str | None = None
    """A published shape (opt: 125m, 350m, 1.3b, 2.7b, 6.7b; roberta: base, large) with its own vocabulary instead
    of the shape keys below, which must then keep their defaults; null: the small CPU config they describe."""
    tokenizer: str = "hf:minilm"
    """hf:NAME, the Hugging Face tokenizer the text data is encoded with (data.tokenizer follows it in experiments)."""
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 128
    max_positions: int = 514
    dropout: float = 0.1
    attention_dropout: float | None = None
    """Dropout on the attention probabilities; null: `dropout` for the small config, the published one with a size."""
    freeze: list[str] = field(default_factory=list)
    """Parameter-name prefixes kept fixed (e.g. [bert.embeddings] for MiniLM): the usual cheaper private fine-tuning,
    as their per-sample gradients are neither formed nor noised; a module left with no trainable parameter runs
    without dropout."""
    pooling: str = "model"
    """model: the checkpoint's own head (BERT's [CLS] pooler); mean: the classifier reads the mean of the last hidden
    states over the real tokens, the pooling sentence encoders such as all-MiniLM-L6-v2 were trained with."""
    lora: LoRAConfig | None = field(default_factory=LoRAConfig)
    """LoRA adapters through peft (dpbench.models.lora): with a rank, only they and the classification head (the
    layers outside the base model; BERT's [CLS] pooler is inside it and stays fixed) train, model.freeze may fix more;
    null, or a null rank: no adapters."""
    cached_features: bool = False
    """With a pretrained encoder that model.freeze fixes whole and model.pooling=mean: its pooled features computed
    once per data split and cached on disk ($XDG_CACHE_HOME/dpbench/encoder_features), and only the head trained on
    them (dpbench.models.fixed_encoder): the same head and per-sample gradients, without an encoder pass a step."""
    trainable_layers: int | None = None
    """Only the top N transformer layers of a pretrained BERT-style encoder train (with the head; model.lora then adapts
    only them): its embeddings and lower layers are fixed. With model.cached_features=true the fixed part's hidden
    states are cached instead of its pooled output (dpbench.models.top_layers); null: every layer trains."""


@dataclass
class OPTModelConfig(TextTransformerConfig):
    name: str = "opt"
    max_positions: int = 512
    """The small OPT's own (conf/model/opt.yaml), so that `model=opt model.size=...` sees every shape key unchanged."""


# The keys a size replaces. A run records them as given, so one changed beside a size is refused, not ignored: the
# schema's defaults (equal to conf/model/*.yaml) tell a changed key from an untouched one.
TEXT_SHAPE = ("hidden_size", "num_layers", "num_heads", "intermediate_size", "max_positions")
VIT_SHAPE = ("patch_size", "hidden_size", "num_layers", "num_heads", "intermediate_size")


def _sized(family: str, config: ViTModelConfig | TextTransformerConfig, shape_keys: tuple[str, ...]) \
        -> PublishedShape | None:
    """The published shape model.size names, or None for the small config; mixing it with other shapes is refused."""
    if config.size is None:
        return None
    if config.pretrained:
        raise ConfigurationError(f"model.size={config.size} builds a published shape from config, model.pretrained="
                                 f"{config.pretrained} loads a checkpoint with its own: set one of them")
    shape = published_shape(family, config.size)
    defaults = {item.name: item.default for item in fields(config)}
    changed = [f"model.{key}={getattr(config, key)}" for key in shape_keys if getattr(config, key) != defaults[key]]
    if changed:
        raise ConfigurationError(
            f"model.size={config.size} sets the whole published shape ({shape.checkpoint}), so it cannot be combined "
            f"with {', '.join(changed)}: drop those, or drop model.size and set the shape keys yourself")
    return shape


class ImageClassifier(nn.Module):
    """(B, C, H, W) -> logits; a pretrained model's images are resized and their channels repeated to fit it."""

    def __init__(self, model: nn.Module, image_size: int, channels: int, resize: bool):
        super().__init__()
        self.model = model
        self.image_size, self.channels, self.resize = image_size, channels, resize

    def forward(self, pixels: Tensor) -> Tensor:
        if self.resize:
            pixels = F.interpolate(pixels, size=(self.image_size, self.image_size), mode="bilinear")
            pixels = pixels.expand(-1, self.channels, -1, -1) if pixels.shape[1] == 1 else pixels
        return self.model(pixel_values=pixels).logits


POOLINGS = ("model", "mean")


class SequenceClassifier(nn.Module):
    """{input_ids, attention_mask, ...} -> logits, with per-sample position ids for BERT-style embeddings.

    With mean pooling the checkpoint's [CLS] pooler is removed (unused, it would still be noised) and its linear
    `classifier` reads the masked mean of the last hidden states. Modules whose parameters are all fixed
    (model.freeze) run as in evaluation, dropout off: a fixed encoder gives fixed features. Built models start in
    training mode, pretrained or not (Lightning does not switch modes when training starts).
    """

    def __init__(self, model: nn.Module, explicit_positions: bool, pooling: str = "model"):
        super().__init__()
        if pooling not in POOLINGS:
            raise ConfigurationError(f"model.pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
        if pooling == "mean":
            _remove_pooler(model)
        self.model = model
        self.explicit_positions = explicit_positions
        self.pooling = pooling

    def train(self, mode: bool = True) -> SequenceClassifier:
        super().train(mode)
        if mode:
            fixed_modules_to_eval(self.model)
        return self

    def forward(self, inputs: dict[str, Tensor]) -> Tensor:
        if not isinstance(inputs, dict):
            raise ConfigurationError("text transformers take input_ids and attention_mask: use data.tokenizer=hf:NAME")
        kwargs = dict(inputs)
        if self.explicit_positions and "position_ids" not in kwargs:
            batch, length = kwargs["input_ids"].shape
            kwargs["position_ids"] = torch.arange(length, device=kwargs["input_ids"].device).expand(batch, length)
        if self.pooling == "model":
            return self.model(**kwargs).logits
        pooled = self.pooled(kwargs)
        dropout = getattr(self.model, "dropout", None)
        return self.model.classifier(dropout(pooled) if isinstance(dropout, nn.Module) else pooled)

    def pooled(self, inputs: dict[str, Tensor]) -> Tensor:
        """(B, hidden): the mean of the last hidden states over the real tokens (model.pooling=mean)."""
        hidden = self.model.base_model(**inputs, return_dict=True).last_hidden_state
        mask = inputs.get("attention_mask", torch.ones_like(inputs["input_ids"])).unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


def _remove_pooler(model: nn.Module) -> None:
    """Mean pooling keeps the encoder and the linear `classifier`; any other trainable head layer is refused."""
    if not isinstance(getattr(model, "classifier", None), nn.Linear):
        raise ConfigurationError(
            f"model.pooling=mean needs a checkpoint whose head is one linear `classifier` layer (BERT-style); "
            f"{type(model).__name__} has another head: use model.pooling=model")
    if getattr(model.base_model, "pooler", None) is not None:
        model.base_model.pooler = None
    kept = (f"{model.base_model_prefix}.", "classifier.")
    unused = [name for name, _ in model.named_parameters() if not name.startswith(kept)]
    if unused:
        raise ConfigurationError(
            f"model.pooling=mean would leave {type(model).__name__}'s head layers {', '.join(unused)} unused (they "
            "would be noised for nothing): use model.pooling=model")


def _image_data(data: DataBundle, model_name: str) -> tuple[int, int]:
    if data.input_shape is None or len(data.input_shape) != 3:
        raise ConfigurationError(f"model={model_name} needs image data (C, H, W); data={data.name} is not")
    channels, height, width = data.input_shape
    if height != width:
        raise ConfigurationError(f"model={model_name} needs square images, got {height}x{width}")
    return channels, height


def build_vit(config: ViTModelConfig, data: DataBundle) -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    channels, size = _image_data(data, "vit")
    shape = _sized("vit", config, VIT_SHAPE)
    dropouts = {"hidden_dropout_prob": config.hidden_dropout, "attention_probs_dropout_prob": config.attention_dropout}
    if shape is not None:
        vit_config = ViTConfig(**{**shape.config, **dropouts}, num_labels=data.num_classes)
        return ImageClassifier(ViTForImageClassification(vit_config), vit_config.image_size, vit_config.num_channels,
                               resize=True)
    if config.pretrained:
        model = load_pretrained(ViTForImageClassification, config.pretrained, num_labels=data.num_classes,
                                ignore_mismatched_sizes=True)
        model.config.hidden_dropout_prob = 0.0
        model.vit.embeddings.dropout.p = 0.0  # see ViTModelConfig.hidden_dropout
        return ImageClassifier(model, model.config.image_size, model.config.num_channels, resize=True)
    if size % config.patch_size:
        raise ConfigurationError(f"model.patch_size {config.patch_size} must divide the image size {size}")
    vit_config = ViTConfig(
        image_size=size, patch_size=config.patch_size, num_channels=channels, hidden_size=config.hidden_size,
        num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
        intermediate_size=config.intermediate_size, num_labels=data.num_classes, **dropouts,
    )
    return ImageClassifier(ViTForImageClassification(vit_config), size, channels, resize=False)


def _text_data(data: DataBundle, model_name: str) -> None:
    features = data.train.features
    if isinstance(features, torch.Tensor) and features.is_floating_point() and features.dim() >= 3:
        raise ConfigurationError(
            f"model={model_name} is a text model and data={data.name} holds images: use a text data set, e.g. "
            "data=rotten_tomatoes (offline), data=sst2 or data=imdb"
        )
    if not isinstance(features, dict):
        raise ConfigurationError(
            f"model={model_name} needs text tokenized by a Hugging Face tokenizer: set data.tokenizer to "
            "${model.tokenizer} (e.g. data.tokenizer=hf:minilm)"
        )


def freeze_parameters(model: nn.Module, prefixes: list[str]) -> None:
    """Fix every parameter whose name starts with one of `prefixes`; a prefix that names nothing is a typo."""
    names = [name for name, _ in model.named_parameters()]
    for prefix in prefixes:
        matched = {name for name in names if name == prefix or name.startswith(prefix + ".")}
        if not matched:
            roots = sorted({".".join(name.split(".")[:2]) for name in names})
            raise ConfigurationError(f"model.freeze: {prefix!r} names no parameter of the model; its modules begin "
                                     f"with {', '.join(roots)}")
        for name, param in model.named_parameters():
            if name in matched:
                param.requires_grad_(False)
    if prefixes and not any(param.requires_grad for param in model.parameters()):
        raise ConfigurationError(f"model.freeze={list(prefixes)} leaves no parameter to train: freeze fewer modules")


def _text_settings(config: TextTransformerConfig, kind: str, shape: PublishedShape | None, tokens: int) \
        -> dict[str, Any]:
    """The transformers config keys of a RoBERTa or OPT: the published shape, or the small one with the tokenizer's
    vocabulary; `model.dropout` (and `model.attention_dropout` when set) apply to either."""
    hidden_dropout, attention_dropout = (("hidden_dropout_prob", "attention_probs_dropout_prob") if kind == "roberta"
                                         else ("dropout", "attention_dropout"))
    if shape is None:
        feed_forward = ({"intermediate_size": config.intermediate_size} if kind == "roberta" else
                        {"ffn_dim": config.intermediate_size, "word_embed_proj_dim": config.hidden_size})
        settings = {"vocab_size": tokens, "hidden_size": config.hidden_size, "num_hidden_layers": config.num_layers,
                    "num_attention_heads": config.num_heads, "max_position_embeddings": config.max_positions,
                    attention_dropout: config.dropout, **feed_forward}
    elif tokens > shape.config["vocab_size"]:
        raise ConfigurationError(
            f"model.tokenizer={config.tokenizer} has {tokens} tokens, more than the {shape.config['vocab_size']} of "
            f"{shape.checkpoint}'s vocabulary (model.size={config.size}): use a tokenizer that fits in it")
    else:
        settings = dict(shape.config)
    settings[hidden_dropout] = config.dropout
    if config.attention_dropout is not None:
        settings[attention_dropout] = config.attention_dropout
    return settings


def _text_model(config: TextTransformerConfig, data: DataBundle, kind: str) -> nn.Module:
    from transformers import AutoModelForSequenceClassification, OPTConfig, RobertaConfig

    shape = _sized(kind, config, TEXT_SHAPE)
    if config.pretrained:
        model = load_pretrained(AutoModelForSequenceClassification, config.pretrained, num_labels=data.num_classes)
        classifier = SequenceClassifier(model, model.config.model_type in EXPLICIT_POSITIONS, config.pooling)
        add_lora(model, config.lora, top_layer_indices(model, config.trainable_layers))
        freeze_parameters(model, [*config.freeze, *lower_prefixes(model, config.trainable_layers)])
        if config.cached_features and config.trainable_layers is not None:
            return top_layers_on_cached_states(classifier, data, config.pretrained, config.trainable_layers)
        if config.cached_features:
            return head_on_cached_features(classifier, data, config.pretrained)
        _text_data(data, kind)
        return classifier.train()  # from_pretrained hands the model over in eval mode
    if config.cached_features or config.trainable_layers is not None:
        raise ConfigurationError("model.cached_features and model.trainable_layers fine-tune a pretrained encoder: set "
                                 "model.pretrained, or drop them")
    _text_data(data, kind)
    if not config.tokenizer.startswith("hf:"):
        raise ConfigurationError(f"model.tokenizer must be hf:NAME, got {config.tokenizer!r}")
    tokenizer = load_tokenizer(config.tokenizer[3:])
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0  # the data's padding, for any shape
    config_class = RobertaConfig if kind == "roberta" else OPTConfig
    model_config = config_class(**_text_settings(config, kind, shape, len(tokenizer)), num_labels=data.num_classes,
                                pad_token_id=pad)
    model = AutoModelForSequenceClassification.from_config(model_config)
    classifier = SequenceClassifier(model, explicit_positions=False, pooling=config.pooling)
    add_lora(model, config.lora)
    freeze_parameters(model, config.freeze)
    return classifier.train()


def build_roberta(config: TextTransformerConfig, data: DataBundle) -> nn.Module:
    return _text_model(config, data, "roberta")


def build_opt(config: OPTModelConfig, data: DataBundle) -> nn.Module:
    return _text_model(config, data, "opt")


def build_minilm(config: TextTransformerConfig, data: DataBundle) -> nn.Module:
    """Fine-tuning the pretrained MiniLM (or another BERT given by model.pretrained)."""
    if not config.pretrained:
        raise ConfigurationError("model=minilm fine-tunes a checkpoint: model.pretrained must be set (default minilm)")
    return _text_model(config, data, "minilm")
