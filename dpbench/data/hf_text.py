"""Text encoded by a Hugging Face tokenizer (`data.tokenizer=hf:NAME`) for the transformer models.

The texts and split come from dpbench.data.text (the same as for the word tokenizer); NAME is a hub name, a local
path, or `minilm` (the bundled MiniLM WordPiece tokenizer, offline).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from dpbench.core.errors import ConfigurationError
from dpbench.data.bundle import DataBundle, TensorSplit

if TYPE_CHECKING:
    from dpbench.data.text import RawText, TextDataConfig

PREFIX = "hf:"


def hf_tokenized(config: TextDataConfig, raw: RawText) -> DataBundle:
    """input_ids and attention_mask, right-padded to the longest sequence of the data (at most data.max_length)."""
    from dpbench.data.hf_checkpoints import load_tokenizer

    if not config.tokenizer.startswith(PREFIX) or len(config.tokenizer) == len(PREFIX):
        raise ConfigurationError(f"a Hugging Face tokenizer is named hf:NAME, got {config.tokenizer!r}")
    if config.max_length <= 1:
        raise ConfigurationError(f"data.max_length must be at least 2, got {config.max_length}")
    tokenizer = load_tokenizer(config.tokenizer[len(PREFIX):])
    lengths = [len(ids) for ids in tokenizer(raw.train_texts + raw.test_texts, truncation=True,
                                             max_length=config.max_length)["input_ids"]]
    length = max(lengths)

    def split(texts: list[str], labels: list[int]) -> TensorSplit:
        encoded = tokenizer(texts, truncation=True, max_length=length, padding="max_length", return_tensors="pt")
        features = {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}
        return TensorSplit(features, torch.tensor(labels))

    return DataBundle(
        config.name, split(raw.train_texts, raw.train_labels), split(raw.test_texts, raw.test_labels),
        raw.num_classes, vocab_size=len(tokenizer), source=f"{raw.source} ({config.tokenizer})",
    )
