"""A run's W&B side: one W&B run per dpbench run, grouped by its sweep, carrying in its config and summary what a
comparison of methods plots (method, epsilon, sigma, q, steps, metric, cost), and results.json as a table. W&B's
own banner and end-of-run summary are silenced: dpbench prints its own summary."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger, WandbLogger
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig

from dpbench.core.redaction import public_config

SUMMARY_KEYS = ("epsilon", "delta", "noise_multiplier", "sampling_rate", "steps", "batch_size", "peak_memory_mb",
                "samples_per_s", "step_time_s", "train_time_s")
"""results.json's keys copied into the W&B summary (beside final/test_<metric>): the axes of a method comparison."""
RESULTS_TABLE = "results"


def run_name(cfg: DictConfig, method: str, tags: list[str]) -> str:
    """The method with its optimizer first; unique within an epsilon, batch-size or learning-rate sweep, so W&B
    runs of one sweep do not collide."""
    privacy = cfg.privacy
    if tags[0] == "nonprivate":
        budget = "nonprivate"
    elif privacy.noise_multiplier is not None:
        budget = f"sigma{privacy.noise_multiplier:g}"
    else:
        budget = f"eps{privacy.epsilon:g}"
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", method).strip("-")
    return f"{slug}-{tags[1]}-{tags[2]}-{budget}-b{cfg.batch_size}-lr{cfg.optimizer.lr:g}-s{cfg.seed}"


def run_group(cfg: DictConfig, sweep_dir: Path | None) -> str:
    """logger.group when set; else one group per multirun (`<experiment>/<sweep dir name>`), so two sweeps of one
    experiment do not mix; a single run's group is its experiment_name."""
    if cfg.logger.group:
        return cfg.logger.group
    return f"{cfg.experiment_name}/{sweep_dir.name}" if sweep_dir is not None else cfg.experiment_name


def job_type(sweep_dir: Path | None) -> str:
    """`sweep` for a multirun's jobs, `train` for a single run: W&B's runs table filters one-off runs out by it."""
    return "sweep" if sweep_dir is not None else "train"


def wandb_logger(
    cfg: DictConfig, run_dir: Path, method: str, tags: list[str], wandb_id: str, sweep_dir: Path | None,
) -> WandbLogger:
    """The run's W&B logger; its config is dpbench's public config plus `method`, the key panels group by."""
    _silence_wandb()
    return WandbLogger(
        project=cfg.logger.project,
        entity=cfg.logger.entity,
        group=run_group(cfg, sweep_dir),
        job_type=job_type(sweep_dir),
        tags=[method, *tags, f"optimizer={cfg.optimizer.name}", *cfg.logger.tags],
        save_dir=str(run_dir),
        mode=os.environ.get("WANDB_MODE", "offline"),
        name=run_name(cfg, method, tags),
        config={**public_config(cfg), "method": method},
        id=wandb_id,
        resume="allow",
    )


def _silence_wandb() -> None:
    """W&B's banner, warnings and end-of-run sparklines off, on the rank that logs (the others start no W&B). Set
    process-wide before the run's init: a per-run setting comes too late for the warning W&B gives about the
    `anonymous` key that Lightning always passes."""
    import wandb

    if rank_zero_only.rank == 0:
        wandb.setup(wandb.Settings(silent=True))


def summary(results: dict[str, Any]) -> dict[str, Any]:
    """The W&B summary's comparison keys; final/test_<metric> is the last model's (nothing is selected on test)."""
    metric = results["test_metric"]
    return {f"final/test_{metric}": results[f"test_{metric}"], **{key: results[key] for key in SUMMARY_KEYS}}


def results_table(results: dict[str, Any]) -> Any:
    """results.json as a one-row table: the rows of a sweep's runs concatenate in a W&B table panel. Nested
    values (the config, per-sample check reports) are JSON text."""
    import wandb

    row = {key: value if value is None or isinstance(value, (str, int, float, bool)) else json.dumps(value)
           for key, value in results.items()}
    return wandb.Table(columns=list(row), data=[list(row.values())])


def finish_wandb(loggers: list[Logger], results: dict[str, Any]) -> str | None:
    """Summary and results table in, run finished; returns the command that uploads an offline run (W&B's own
    hint is silenced with the rest of its output)."""
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            run = logger.experiment
            run.summary.update(summary(results))
            run.log({RESULTS_TABLE: results_table(results)})
            upload = None
            if run.offline:  # a resumed run continues the same id from a directory of its own: sync them all
                pieces = sorted(Path(run.dir).parent.parent.glob(f"offline-run-*-{run.id}")) or [Path(run.dir).parent]
                upload = "wandb sync " + " ".join(map(str, pieces))
            run.finish()
            return upload
    return None
