"""Keep an explicit privacy.seed out of everything a run writes: whoever knows it can regenerate the noise.

However it is spelled (`privacy.seed=N`, `+privacy.seed=N`, `++privacy.seed=N`, `privacy={seed:N}`, a sweep's
`privacy.seed=1,2,3` on the command line or in `hydra.sweeper.params`), an override that can set the seed has its
value replaced whole. results.json, W&B and the CSV get the config with the seed replaced; Hydra's saved configs of
the run and of the sweep (`config.yaml`, `overrides.yaml`, `hydra.yaml`'s task overrides, `override_dirname` and
sweeper params, `multirun.yaml`) and refused.json are redacted; the process's own argv (which W&B records, and from
which Lightning starts the other ranks of a multi-device run) gets `privacy.seed=null`, which parses: those ranks
then take rank 0's secret root by broadcast (DPModule.setup). What
dpbench cannot reach stays the user's to guard: the command line itself (shell history, a multirun's job lines on
the console) and a run directory named after it (`hydra.job.override_dirname` in `hydra.run.dir` or
`hydra.sweep.subdir`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
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


def _override_key(override: str) -> str:
    """The config key an override sets, as Hydra reads it: without +, ++ or ~ and without an @package."""
    return override.partition("=")[0].strip().lstrip("+~").partition("@")[0]


def sets_privacy_seed(override: str) -> bool:
    """`privacy.seed=...` in any of Hydra's forms, or a whole `privacy={...}` node that mentions the seed."""
    key, value = _override_key(override), override.partition("=")[2]
    return key == SEED_KEY or (key == "privacy" and "seed" in value)


def redact_override(override: str) -> str:
    """The override with its value replaced whole when it can set the seed; any other string unchanged."""
    key, separator, _ = override.partition("=")
    return f"{key}={SECRET}" if separator and sets_privacy_seed(override) else override


def redact_overrides(overrides: Iterable[str]) -> list[str]:
    return [redact_override(str(override)) for override in overrides]


SEED_VALUE = re.compile(r"(\bseed\s*:\s*)[^,}\]]+")
NULL_SEED = r"\1null"


def argv_without_seed(argv: Iterable[str]) -> list[str]:
    """The command line with every seed it sets replaced by null: parsable by a rank Lightning starts from it."""
    def neutral(argument: str) -> str:
        if not sets_privacy_seed(argument):
            return argument
        key, _, value = argument.partition("=")
        if _override_key(argument) == SEED_KEY:
            return f"{key}=null"
        return f"{key}={SEED_VALUE.sub(NULL_SEED, value)}"

    return [neutral(str(argument)) for argument in argv]


def redact_value(text: str, seed: Any) -> str:
    """An error message about privacy.seed (the only kind that quotes its value, e.g. an invalid one) with the
    value replaced; other messages are left whole, so a seed such as 1 does not blank every 1 in them."""
    if seed is None or SEED_KEY not in text:
        return text
    return re.sub(rf"(?<![\w.]){re.escape(str(seed))}(?![\w.])", SECRET, text)


def _redact_list(overrides: ListConfig) -> bool:
    redacted = redact_overrides(overrides)
    changed = redacted != list(overrides)
    for index, override in enumerate(redacted):
        overrides[index] = override
    return changed


def _override_dirname(saved: DictConfig, task: Iterable[str]) -> str | None:
    """hydra.job.override_dirname as Hydra builds it (sorted task overrides minus its excluded keys)."""
    settings = OmegaConf.select(saved, "hydra.job.config.override_dirname")
    if settings is None:
        return None
    lines = sorted(str(o) for o in task if _override_key(str(o)) not in settings.exclude_keys)
    return re.sub("=", settings.kv_sep, settings.item_sep.join(lines))


def _redact_hydra_config(saved: DictConfig) -> bool:
    changed = False
    if OmegaConf.select(saved, SEED_KEY) not in (None, SECRET):
        OmegaConf.update(saved, SEED_KEY, SECRET)
        changed = True
    params = OmegaConf.select(saved, "hydra.sweeper.params")  # a sweep kept in a config file, an Optuna space
    for key, value in (params or {}).items():
        if value != SECRET and sets_privacy_seed(f"{key}={value}"):
            params[key] = SECRET
            changed = True
    task = OmegaConf.select(saved, "hydra.overrides.task")
    if task is not None and _redact_list(task):
        dirname = _override_dirname(saved, task)
        if dirname is not None:
            OmegaConf.update(saved, "hydra.job.override_dirname", dirname)
        changed = True
    return changed


def redact_saved_configs(directory: Path) -> None:
    """Rewrite Hydra's saved configs in `directory` with the explicit privacy seed replaced (files that hold none
    are left untouched, so the jobs of a sweep rewrite its multirun.yaml once)."""
    for name in HYDRA_FILES:
        path = Path(directory) / name
        if not path.exists():
            continue
        saved = OmegaConf.load(path)
        changed = _redact_list(saved) if isinstance(saved, ListConfig) else _redact_hydra_config(saved)
        if changed:
            OmegaConf.save(saved, path)
