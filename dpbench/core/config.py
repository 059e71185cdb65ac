"""Dataclass schemas of the top-level config: a mistyped key is an error, never a silently ignored default."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from dpbench.core.errors import ConfigurationError, did_you_mean
from dpbench.core.optim import OptimizerConfig


@dataclass
class PrivacyConfig:
    epsilon: float | None = 3.0
    """Target epsilon; the noise multiplier is calibrated to it when noise_multiplier is null. Beside a fixed
    noise_multiplier it is no target: the noise wins (stop_on_budget stops at it; results.json says which won)."""
    delta: float = 1e-5
    """At or above 1/N (training samples) it is refused unless allow_large_delta; above 1/N^1.1 it is warned of."""
    noise_multiplier: float | None = None
    clip_norm: float = 1.0
    sampling: str = "poisson"
    """poisson (what the accountant assumes) | shuffle (fixed batches; recorded in results)."""
    accountant_eps_error: float = 0.01
    stop_on_budget: bool = False
    """Stop training at the last step whose composed epsilon stays within `epsilon` (for a fixed noise_multiplier)."""
    seed: int | None = None
    """Root of the secret privacy randomness (noise, Poisson sampling, JL directions, D2P2 projections, sparse
    selection). null: 128 bits from the OS, kept only in checkpoints. A number makes the run bit-reproducible and
    must then stay secret: whoever knows it can regenerate the noise and the batches."""
    secure_rng: bool = False
    """Every secret draw from a CSPRNG stream (SHAKE-256 keyed by the root) rather than a seeded PRNG."""
    max_epsilon: float | None = 100.0
    """A target or planned epsilon above this is refused before training (null: no limit). 100 is over three times
    the largest epsilon any reproduced paper trains at (30) and a likelihood ratio of e^100: no guarantee left."""
    allow_infinite_epsilon: bool = False
    """Run even when the planned epsilon is infinite (e.g. JL with r = 1, to time it): results say so."""
    allow_large_delta: bool = False
    """Run with delta at or above 1/N, where a mechanism that publishes a random training record outright meets
    the (epsilon, delta) claim."""


@dataclass
class TrainerConfig:
    accelerator: str = "auto"
    devices: Any = 1
    strategy: str = "auto"
    """Lightning strategy, e.g. ddp: each rank Poisson-samples its shard; sums meet in one all-reduce, noised once."""
    num_nodes: int = 1
    precision: str = "32-true"
    """32-true, 64-true or bf16-mixed (see check_precision)."""
    enable_progress_bar: bool = True
    log_every_n_steps: int = 10
    check_val_every_n_epoch: int | None = 1
    num_threads: int | None = None
    keep_freed_host_memory: bool = True
    """glibc keeps the memory a step frees instead of faulting it in again at the next step (training/host_memory.py):
    on CPU up to 40% of a step's time in some processes, at the cost of a higher resident peak where the heap fragments
    (DP-LoRA on MiniLM at batch 1024: 8.5 against 5.0 GB after 8 steps); false: glibc's defaults."""
    memory_check: bool = True
    """Refuse a run whose estimated peak memory is past 90% of the free memory (app/memory_estimate.py)."""
    checkpoint: bool = True
    """Write checkpoints/last.ckpt during training (cadence below), on SIGINT/SIGTERM and at the end."""
    checkpoint_every_n_steps: int | None = 100
    checkpoint_every_minutes: float | None = 10.0
    """Whichever comes first; null turns that trigger off."""


@dataclass
class LoggerConfig:
    csv: bool = True
    wandb: bool = True
    project: str = "dpbench"
    entity: str | None = None
    group: str | None = None
    tags: list[str] = field(default_factory=list)
    train_stats: bool | None = None
    """Log train/loss, train/batch_size, gradient norms and clip fractions every step: computed from the private
    data without noise, so outside the privacy guarantee (the realised batch size alone can reveal membership).
    null (default): on for non-private runs, off for private ones; true opts a private run in, and says so."""


@dataclass
class ProfilerConfig:
    warmup_steps: int = 5
    fresh_process: str = "multirun"
    """always | multirun | never: run the job in a fresh process so its peak memory is its own."""


@dataclass
class Config:
    model: Any = MISSING
    data: Any = MISSING
    privatizer: Any = MISSING
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    experiment_name: str = "default"
    seed: int = 0
    """Public: initialisation, dropout and data order. Never used for privacy randomness (see privacy.seed)."""
    batch_size: int = 256
    """Expected logical batch size: the Poisson sampling rate is batch_size / N."""
    physical_batch_size: int | None = None
    """Micro-batch size for gradient accumulation (memory); noise is still added once per logical batch."""
    eval_batch_size: int | None = None
    """Samples per evaluation batch; null: the training micro-batch (physical_batch_size, else batch_size)."""
    epochs: int = 30
    max_steps: int | None = None
    resume: Any = False
    """false | true (continue hydra.run.dir's checkpoint; an error if there is none) | auto (continue if possible)."""
    extend_run: bool = False
    """On resume, allow a longer schedule at the checkpoint's noise multiplier (the epsilon spent then grows)."""


def _positive(value: float | None, key: str, meaning: str, optional: bool = False) -> None:
    if value is None and optional:
        return
    if value is None or isinstance(value, bool) or not (math.isfinite(value) and value > 0):
        raise ConfigurationError(f"{key} must be {meaning}, got {value}")


PRECISIONS = ("32", "32-true", "64", "64-true", "bf16-mixed")
MIXED_PRECISION = "bf16-mixed"
NARROW_PRECISIONS = {
    "16-mixed": "fp16 needs a loss scale that would have to be undone per sample before clipping",
    "16": "fp16 needs a loss scale that would have to be undone per sample before clipping",
    "16-true": "fp16 weights would round the noisy update away",
    "bf16-true": "bf16 weights would round the noisy update away",
    "bf16": "say bf16-mixed (float32 weights, bf16 forward and backward)",
}


def check_precision(precision: Any) -> None:
    """32, 64 or bf16-mixed: under bf16-mixed the weights stay float32 (the master copies) and only the model's forward
    and backward run at bf16; dpbench forms the per-sample norms, clipping, sums and noise in float32 itself
    (dpbench.privatizers.per_sample.precision). fp16 and half-precision weights are refused."""
    if str(precision) not in PRECISIONS:
        reason = NARROW_PRECISIONS.get(str(precision), "not a precision dpbench supports")
        raise ConfigurationError(
            f"trainer.precision={precision} is not supported ({reason}): use trainer.precision=bf16-mixed, 32-true "
            "or 64-true"
        )


def check_run_settings(config: Config) -> None:
    """The top-level numbers a run cannot be honest with: refused before any data is loaded."""
    _positive(config.batch_size, "batch_size", "a positive expected batch size")
    _positive(config.eval_batch_size, "eval_batch_size",
              "a positive number of samples per evaluation batch, or null for the training micro-batch", optional=True)
    _positive(config.physical_batch_size, "physical_batch_size",
              "a positive micro-batch size, or null for no micro-batching", optional=True)
    _positive(config.max_steps, "max_steps", "a positive number of steps, or null to train `epochs`", optional=True)
    if config.max_steps is None:
        _positive(config.epochs, "epochs", "a positive number of epochs (or set max_steps)")
    _positive(config.optimizer.lr, "optimizer.lr", "a positive finite learning rate")
    for key in ("momentum", "weight_decay", "eps"):
        value = getattr(config.optimizer, key)
        if not (math.isfinite(value) and value >= 0):
            raise ConfigurationError(f"optimizer.{key} must be a finite number >= 0, got {value}")
    _positive(config.trainer.log_every_n_steps, "trainer.log_every_n_steps", "a positive number of steps")
    _positive(config.trainer.checkpoint_every_n_steps, "trainer.checkpoint_every_n_steps",
              "a positive number of steps, or null", optional=True)
    _positive(config.trainer.checkpoint_every_minutes, "trainer.checkpoint_every_minutes",
              "a positive number of minutes, or null", optional=True)
    check_precision(config.trainer.precision)


def register_schemas() -> None:
    ConfigStore.instance().store(name="dpbench_schema", node=Config)


def validated(schema: type, config: DictConfig | dict, group: str) -> Any:
    """Merge a config node into its dataclass schema so that a mistyped key is an error, not a default."""
    if isinstance(config, DictConfig):  # resolve interpolations to other groups (data.tokenizer: ${model.tokenizer})
        config = OmegaConf.to_container(config, resolve=True)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), config)
    except ConfigKeyError as error:  # full_key: the path inside the node (lora.rnk), parent_node: where it sits
        path = str(error.full_key or error.key)
        parent = path.rpartition(".")[0]
        owner = error.object_type.__name__ if isinstance(error.object_type, type) else schema.__name__
        fields = ([str(name) for name in error.parent_node.keys()] if error.parent_node is not None
                  else [str(name) for name in OmegaConf.structured(schema).keys()])
        where = f"{group}.{parent}." if parent else f"{group}."
        raise ConfigurationError(f"invalid `{group}` config: {group}.{path} is not a key of {owner}"
                                 f"{did_you_mean(str(error.key), fields, where)}") from None
    except ValidationError as error:
        raise ConfigurationError(f"invalid `{group}` config: {group}.{error.full_key}: "
                                 f"{str(error.msg).strip().splitlines()[0]}") from None
    return OmegaConf.to_object(merged)
