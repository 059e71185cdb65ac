"""Keep an explicit privacy.seed out of everything a run writes: whoever knows it can regenerate the noise.

results.json, W&B and the CSV get the config with the seed replaced; Hydra's saved configs of the run (and of a
sweep) are rewritten the same way. What dpbench cannot reach stays the user's to guard: the command line itself
(shell history, a multirun's job log lines) and a run directory named after it (hydra.job.override_dirname).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

SECRET = "<secret>"
SEED_KEY = "privacy.seed"
HYDRA_FILES = ("config.yaml", "overrides.yaml", "hydra.yaml", "multirun.yaml")


def public_config(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as it may be published."""
    container = OmegaConf.to_container(cfg, resolve=True)
    privacy = container.get("privacy")
    if isinstance(privacy, dict) and privacy.get("seed") is not None:
        privacy["seed"] = SECRET
    return container


def _redact_overrides(overrides: ListConfig) -> None:
    for index, override in enumerate(overrides):
        key, _, _ = str(override).lstrip("+~").partition("=")
        if key == SEED_KEY:
            overrides[index] = f"{str(override).partition('=')[0]}={SECRET}"


def redact_saved_configs(directory: Path) -> None:
    """Rewrite Hydra's saved configs in `directory` with the explicit privacy seed replaced."""
    for name in HYDRA_FILES:
        path = Path(directory) / name
        if not path.exists():
            continue
        saved = OmegaConf.load(path)
        if isinstance(saved, ListConfig):
            _redact_overrides(saved)
        else:
            if OmegaConf.select(saved, SEED_KEY) is not None:
                OmegaConf.update(saved, SEED_KEY, SECRET)
            task_overrides = OmegaConf.select(saved, "hydra.overrides.task")
            if task_overrides is not None:
                _redact_overrides(task_overrides)
            dirname = OmegaConf.select(saved, "hydra.job.override_dirname")
            if dirname:
                redacted = re.sub(r"(privacy\.seed=)[^,]*", rf"\g<1>{SECRET}", dirname)
                OmegaConf.update(saved, "hydra.job.override_dirname", redacted)
        OmegaConf.save(saved, path)
