"""LoRA adapters on a Hugging Face classifier through peft (`model.lora`): DP-LoRA (Yu et al., ICLR 2022).

Private fine-tuning of a pretrained encoder learns where full fine-tuning does not when few parameters train: the
noise grows with their number. peft injects its `lora.Linear` layers in place (the model keeps its class and
attributes, so dpbench's SequenceClassifier wraps it unchanged) and freezes everything else; the classification
head, new and randomly initialized, is trained beside the adapters. The adapters are plain nn.Linear layers called
inside peft's layer, so the per-sample engines serve them with their Linear rule (checked by the per-sample zoo).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from dpbench.core.errors import ConfigurationError


@dataclass
class LoRAConfig:
    rank: int | None = None
    """r, the adapters' rank; null: no adapters (the whole model trains, less what model.freeze fixes)."""
    targets: list[str] | None = None
    """Names of the Linear layers that get adapters (peft's target_modules: a name matches a module whose dotted
    name ends with it, e.g. [query, value]); null: peft's default for the architecture (query and value for BERT,
    MiniLM and RoBERTa, q_proj and v_proj for OPT)."""
    alpha: float | None = None
    """The adapters' update is scaled by alpha / rank; null: alpha = rank (scale 1)."""
    dropout: float = 0.0
    """Dropout on the adapters' input (peft's lora_dropout)."""


def _checked(config: LoRAConfig) -> LoRAConfig:
    """Values peft would accept silently but that make no sense, refused with the key to fix."""
    if config.rank is not None and config.rank < 1:
        raise ConfigurationError(f"model.lora.rank must be at least 1 (or null: no adapters), got {config.rank}")
    if config.targets is not None and not config.targets:
        raise ConfigurationError("model.lora.targets is empty: name the layers to adapt (e.g. [query,value]) or null "
                                 "for peft's default")
    if config.alpha is not None and config.alpha <= 0:
        raise ConfigurationError(f"model.lora.alpha must be positive (or null: alpha = rank), got {config.alpha}")
    if not 0.0 <= config.dropout < 1.0:
        raise ConfigurationError(f"model.lora.dropout must be in [0, 1), got {config.dropout}")
    return config


def _linear_names(model: nn.Module) -> list[str]:
    """The last name part of every Linear layer: what model.lora.targets can name."""
    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, nn.Linear)})


def add_lora(model: nn.Module, config: LoRAConfig | None, layers: list[int] | None = None) -> None:
    """Inject LoRA adapters into a transformers model in place; only they and the head (the parameters outside the
    base model, e.g. BERT's `classifier`) stay trainable. None or a null rank leaves the model as it is. `layers`:
    the indices of the encoder layers that get adapters (model.trainable_layers), None: all of them."""
    if config is None or _checked(config).rank is None:
        return
    from peft import LoraConfig, inject_adapter_in_model

    placement = {} if layers is None else {"layers_to_transform": layers, "layers_pattern": "layer"}
    settings = LoraConfig(r=config.rank, lora_alpha=config.alpha if config.alpha is not None else config.rank,
                          target_modules=config.targets, lora_dropout=config.dropout, **placement)
    try:
        inject_adapter_in_model(settings, model)
    except ValueError as error:  # peft's NoMatchingPeftModuleError included
        layers = ", ".join(_linear_names(model))
        raise ConfigurationError(
            f"model.lora.targets={config.targets}: peft cannot adapt this model ({error}); name its Linear "
            f"layers: {layers}") from None
    encoder = {id(param) for param in getattr(model, "base_model", model).parameters()}
    for param in model.parameters():
        if id(param) not in encoder:
            param.requires_grad_(True)
