"""Four labelled sentences tokenized for the pretrained MiniLM (offline): the data of the fixed-encoder tests."""

from dpbench.data.bundle import DataBundle

TEXTS = ["a fine film", "dull and far too long, sadly", "the cast is wonderful", "not worth the ticket"]


def minilm_sentences() -> DataBundle:
    from dpbench.data.hf_text import hf_tokenized
    from dpbench.data.text import RawText, TextDataConfig

    raw = RawText(TEXTS, [1, 0, 1, 0], ["great fun", "a bore"], [1, 0], 2, "fixture")
    return hf_tokenized(TextDataConfig(name="fixture", tokenizer="hf:minilm", max_length=12), raw)
