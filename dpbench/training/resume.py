"""What `resume` means: which checkpoint, whether it is readable, which config it continues, whether the run it
continues is the same, and whether there is anything left to run.

A resume continues the config the checkpoint saved: `resume=true hydra.run.dir=X` needs no other override, and an
override on the resume command replaces the saved value of its key (a key that resume may not change is then
refused by `check_resume`, naming it).

A resume may only continue the privacy plan it was started with (sigma, q, planned steps, delta, clip norm,
sampling, target): a changed schedule would recalibrate sigma mid-run and overspend the target. With
`extend_run=true` the planned steps may grow at the checkpoint's sigma, and results.json reports the epsilon spent.
Everything here runs before any logger or trainer touches the run directory, so a refused resume changes nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from dpbench.core.errors import ConfigurationError
from dpbench.core.redaction import SECRET
from dpbench.core.results import RunResults, read_results
from dpbench.training.checkpoint_io import load_checkpoint
from dpbench.training.checkpointing import RUN_STATE_KEY
from dpbench.training.sharded_checkpoint import recover_interrupted_swap, sharded_metadata

RESUME_MODES = {"false": "false", "true": "true", "auto": "auto"}
PLAN_KEYS = ("private", "sampling", "sampling_rate", "steps", "delta", "clip_norm", "noise_multiplier", "calibrated")
CONFIG_KEYS_IGNORED = ("resume", "extend_run", "trainer", "logger", "profiler", "eval_batch_size",
                       "physical_batch_size", "experiment_name")
"""Top-level config keys a resume may change: they do not touch the model, the data or the privacy mechanism."""
SCHEDULE_KEYS = ("epochs", "max_steps")
ALWAYS_FROM_COMMAND = ("resume", "extend_run")
"""What the resume command says about resuming holds, however it was set."""
_ABSENT = object()
CHECKPOINT_DIR = "checkpoints"
CHECKPOINT_FILE = "last.ckpt"


@dataclass
class SavedRun:
    """The part of a checkpoint that a resume is checked against."""

    path: Path
    plan: dict[str, Any]
    config: dict[str, Any]
    wandb_id: str | None
    step: int | None
    log_step: int | None
    """The logging step the run continues from: CSV rows from it on are logged again by the resumed run."""
    randomness: dict[str, Any] | None = None
    """The privacy randomness's state (secret: its root), which a resume's privacy.seed must match."""


def resume_mode(value: Any) -> str:
    key = str(value).lower() if isinstance(value, bool) else value.lower() if isinstance(value, str) else None
    mode = RESUME_MODES.get(key)
    if mode is None:
        raise ConfigurationError(f"resume must be false, true or auto, got {value!r}")
    return mode


def checkpoint_to_resume(value: Any, checkpoint: Path) -> Path | None:
    """The checkpoint `resume` asks for: true needs one, auto takes one if it is there."""
    mode = resume_mode(value)
    if mode == "false":
        return None
    if checkpoint.exists():
        return checkpoint
    if mode == "auto":
        return None
    raise ConfigurationError(
        f"resume=true but there is no checkpoint {checkpoint}: pass the interrupted run's directory as "
        "hydra.run.dir, or use resume=auto to start a new run when there is nothing to resume"
    )


def checkpoint_path(run_dir: Path) -> Path:
    """The run's checkpoint (a file, or a directory of shards under trainer.strategy=fsdp), one a kill left aside
    mid-swap put back."""
    path = Path(run_dir) / CHECKPOINT_DIR / CHECKPOINT_FILE
    recover_interrupted_swap(path)
    return path


def finished_results(run_dir: Path) -> RunResults | None:
    """The results.json of a run that ran to its end (not the record of one a failed per-sample check stopped)."""
    try:
        results = read_results(run_dir)
    except (FileNotFoundError, ValueError):
        return None
    return results if isinstance(results, RunResults) else None


def config_to_resume(cfg: DictConfig, run_dir: Path, overrides: list[str]) -> DictConfig:
    """The config a resume continues: the checkpoint's, with the keys the resume command's overrides set taken from
    `cfg`. An override that sets no single key (`+experiment=NAME`, a deletion, an @package) keeps `cfg` whole, as
    composed: check_resume then compares all of it. Without a checkpoint to resume, `cfg` itself."""
    if resume_mode(cfg.resume) == "false" or not checkpoint_path(run_dir).exists():
        return cfg
    saved = read_saved_run(checkpoint_path(run_dir))
    merged = OmegaConf.create(saved.config)
    for override in OverridesParser.create().parse_overrides([str(o) for o in overrides]):
        key = override.key_or_group
        if key == "hydra" or key.startswith("hydra."):
            continue
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        if override.is_delete() or override.package is not None or value is _ABSENT:
            return cfg
        OmegaConf.update(merged, key, value, merge=False, force_add=True)
    for key in ALWAYS_FROM_COMMAND:
        merged[key] = cfg.get(key)
    if OmegaConf.select(merged, "privacy.seed") == SECRET:  # an explicit seed is never saved: the checkpoint's
        merged.privacy.seed = None  # root continues (a seed given on the command line must match it)
    return merged


def read_saved_run(path: Path) -> SavedRun:
    """Load the checkpoint's run state; a torn, empty, foreign or crafted file is one clear error, not a traceback
    (and a crafted one runs nothing: see `load_checkpoint`)."""
    try:
        checkpoint = load_checkpoint(sharded_metadata(path) if path.is_dir() else path, mmap=True)
    except ConfigurationError:
        raise
    except Exception as error:  # torch raises many kinds for a torn file: all mean the same to the user
        raise ConfigurationError(
            f"checkpoint {path} cannot be read ({type(error).__name__}: {str(error).splitlines()[0][:120]}): it is "
            "truncated or corrupt; delete it and rerun with resume=false (starts over) or restore a good copy"
        ) from None
    state = checkpoint.get(RUN_STATE_KEY) if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict) or "plan" not in state:
        raise ConfigurationError(
            f"checkpoint {path} has no dpbench privacy plan (written by another tool or an older dpbench): it "
            "cannot be resumed safely; start over with resume=false in a new hydra.run.dir"
        )
    module_state = checkpoint.get("dpbench") if isinstance(checkpoint.get("dpbench"), dict) else {}
    return SavedRun(Path(path), state["plan"], state.get("config", {}), state.get("wandb_id"),
                    state.get("step"), state.get("log_step"), module_state.get("privacy_randomness"))


def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def changed_config_keys(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Config keys whose values differ, as `key: old -> new` (keys that do not touch the run's math are left out)."""
    old, new = _flatten(saved), _flatten(current)
    changes = []
    for key in sorted(set(old) | set(new)):
        if key.split(".")[0] in CONFIG_KEYS_IGNORED or old.get(key) == new.get(key):
            continue
        if key == "privacy.seed" and new.get(key) is None:  # the checkpoint's own stream continues
            continue
        changes.append(f"{key}: {old.get(key, '<unset>')} -> {new.get(key, '<unset>')}")
    return changes


def _same(old: Any, new: Any) -> bool:
    if isinstance(old, float) and isinstance(new, float):
        return math.isclose(old, new, rel_tol=1e-9)
    return old == new


def check_resume(saved: SavedRun, plan: dict[str, Any], config: dict[str, Any], extend: bool) -> None:
    """Refuse a resume that changes the privacy plan or any config key of the model, data, privatizer, optimizer or
    privacy (only the schedule may grow, with extend_run), naming what changed."""
    differing = [key for key in PLAN_KEYS if not _same(saved.plan.get(key), plan.get(key))]
    changed = changed_config_keys(saved.config, config)
    if extend:
        if plan["steps"] < saved.plan["steps"]:
            raise ConfigurationError(
                f"extend_run=true shortens the run ({saved.plan['steps']} -> {plan['steps']} planned steps): "
                "extend_run only lengthens it"
            )
        differing = [key for key in differing if key not in ("steps", "calibrated")]
        changed = [change for change in changed if change.split(":")[0] not in SCHEDULE_KEYS]
    if not differing and not changed:
        return
    plan_changes = ", ".join(f"{key} {saved.plan.get(key)} -> {plan.get(key)}" for key in differing) or "unchanged"
    schedule_only = set(differing) <= {"steps", "calibrated", "noise_multiplier"} and all(
        change.split(":")[0] in SCHEDULE_KEYS or change.startswith("privacy.noise_multiplier") for change in changed
    )
    hint = (
        "resume with the checkpoint's schedule, or add extend_run=true to continue at the checkpoint's noise "
        "multiplier (results.json then reports the larger epsilon spent)" if schedule_only and not extend else
        "resume with the checkpoint's config, or start a new run in another hydra.run.dir"
    )
    raise ConfigurationError(
        f"resume would change the run in {saved.path}: changed config keys: {'; '.join(changed) or 'none'}; "
        f"privacy plan: {plan_changes}. {hint}"
    )
