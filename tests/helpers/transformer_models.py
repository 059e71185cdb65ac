"""Tiny Hugging Face transformers (built from configs, dropout off) with batches, for per-sample tests."""

import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    GPT2Config,
    GPT2ForSequenceClassification,
    OPTConfig,
    OPTForSequenceClassification,
    RobertaConfig,
    RobertaForSequenceClassification,
    ViTConfig,
    ViTForImageClassification,
)

from dpbench.models.hf import ImageClassifier, SequenceClassifier
from dpbench.models.lora import LoRAConfig, add_lora

SIZES = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "num_labels": 3}
TEXT = {**SIZES, "vocab_size": 40, "pad_token_id": 0}
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def text_batch(size: int = 4, length: int = 6, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 40, (size, length), generator=generator)
    mask = torch.ones(size, length, dtype=torch.long)
    mask[0, -2:] = 0  # right padding on some samples
    mask[2, -1:] = 0
    ids = ids * mask
    return {"input_ids": ids, "attention_mask": mask}, torch.randint(0, 3, (size,), generator=generator)


def image_batch(size: int = 4, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(size, 1, 8, 8, generator=generator), torch.randint(0, 3, (size,), generator=generator)


def vit():
    config = ViTConfig(**SIZES, image_size=8, patch_size=4, num_channels=1, intermediate_size=24, **NO_DROPOUT)
    return ImageClassifier(ViTForImageClassification(config), 8, 1, resize=False)


def roberta():
    config = RobertaConfig(**TEXT, intermediate_size=24, max_position_embeddings=12, **NO_DROPOUT)
    return SequenceClassifier(RobertaForSequenceClassification(config), explicit_positions=False)


def bert(explicit_positions: bool = True, pooling: str = "model"):
    config = BertConfig(**TEXT, intermediate_size=24, max_position_embeddings=12, **NO_DROPOUT)
    return SequenceClassifier(BertForSequenceClassification(config), explicit_positions, pooling)


def bert_mean_pooled():
    return bert(pooling="mean")


def bert_lora(targets: tuple[str, ...] = ("query", "value")):
    """Mean-pooled BERT with peft LoRA adapters (rank 4) through model.lora's add_lora. The adapters are drawn at
    random: peft starts one of each pair at zero, which would leave its partner's per-sample gradients all zero."""
    model = bert(pooling="mean")
    add_lora(model.model, LoRAConfig(rank=4, targets=list(targets), alpha=8.0))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator))
    return model


def opt():
    config = OPTConfig(**TEXT, ffn_dim=24, max_position_embeddings=12, word_embed_proj_dim=16, dropout=0.0,
                       attention_dropout=0.0)
    return SequenceClassifier(OPTForSequenceClassification(config), explicit_positions=False)


def gpt2():
    """GPT-2's attention and MLP are HF Conv1D layers (transposed Linear weights)."""
    config = GPT2Config(vocab_size=40, n_embd=16, n_layer=1, n_head=2, n_positions=12, num_labels=3, pad_token_id=0,
                        bos_token_id=1, eos_token_id=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return SequenceClassifier(GPT2ForSequenceClassification(config), explicit_positions=True)


TRANSFORMERS = {
    "vit": (vit, image_batch),
    "roberta": (roberta, text_batch),
    "bert": (bert, text_batch),
    "bert_mean_pooled": (bert_mean_pooled, text_batch),
    "bert_lora": (bert_lora, text_batch),
    "opt": (opt, text_batch),
    "gpt2": (gpt2, text_batch),
}


def single(batch, i: int):
    inputs, targets = batch
    if isinstance(inputs, dict):
        return {k: v[i : i + 1] for k, v in inputs.items()}, targets[i : i + 1]
    return inputs[i : i + 1], targets[i : i + 1]
