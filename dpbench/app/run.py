"""One run: data, privatizer, privacy plan, model, Lightning fit and test, results.json."""

from __future__ import annotations

import logging
import math
import os
import secrets
import signal
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig
from torch import nn

from dpbench.app.memory_estimate import MemoryEstimate, check_fits, estimate_memory
from dpbench.app.run_output import drop_lightning_console, library_warnings_to_log
from dpbench.app.wandb_run import finish_wandb, wandb_logger
from dpbench.core.config import Config, check_run_settings, validated
from dpbench.core.errors import ConfigurationError, RunInterrupted
from dpbench.core.methods import method_label, off_paper, with_precision, with_variant
from dpbench.core.redaction import SECRET, public_config
from dpbench.core.registry import options
from dpbench.core.results import RunResults, StoppedRun, summary_text, write_json_atomic, write_results
from dpbench.core.tasks import score_bound_of
from dpbench.data import load_data
from dpbench.data.bundle import DataBundle
from dpbench.models import MODELS, build_model
from dpbench.privacy.accountant import PrivacyAccountant
from dpbench.privacy.budget import steps_within_budget
from dpbench.privacy.ledger import PrivacyLedger
from dpbench.privacy.randomness import PrivacyRandomness
from dpbench.privatizers import (
    STRATEGIES,
    PrivacySettings,
    PrivatizerStrategy,
    check_strategy_precision,
    check_strategy_sharding,
    make_strategy,
)
from dpbench.privatizers.per_sample import PerSampleMismatch
from dpbench.privatizers.privacy_plan import PrivacyPlan, declared_composition, make_plan, noise_multiplier_source
from dpbench.profiling import ProfilerCallback
from dpbench.training.callbacks import EpsilonLogger
from dpbench.training.checkpoint_io import AtomicCheckpointIO
from dpbench.training.checkpointing import PeriodicCheckpoint, StopSignals
from dpbench.training.csv_history import HistoryCSVLogger
from dpbench.training.datamodule import DPDataModule
from dpbench.training.host_memory import DEFAULTS, keep_freed_host_memory
from dpbench.training.module import DPModule
from dpbench.training.progress import RunProgressBar, shows_progress
from dpbench.training.resume import (
    SavedRun,
    check_resume,
    checkpoint_path,
    checkpoint_to_resume,
    finished_results,
    read_saved_run,
    resume_mode,
)
from dpbench.training.sharding import lightning_strategy

log = logging.getLogger(__name__)
LEDGER_FILE = "privacy_ledger.json"


def _steps_within_budget(typed: Config, plan: PrivacyPlan, strategy: PrivatizerStrategy, steps: int) -> int:
    """privacy.stop_on_budget with a fixed noise multiplier: train only the steps the epsilon budget covers."""
    if not (typed.privacy.stop_on_budget and plan.private and not plan.calibrated and typed.privacy.epsilon):
        return steps
    budget = steps_within_budget(
        lambda t: strategy.composition(plan.noise_multiplier, t), typed.privacy.epsilon, typed.privacy.delta,
        steps, PrivacyAccountant(eps_error=typed.privacy.accountant_eps_error),
    )
    if budget == 0:
        raise ConfigurationError(
            f"privacy.epsilon={typed.privacy.epsilon} does not cover a single step at noise multiplier "
            f"{plan.noise_multiplier}"
        )
    log.info("privacy.stop_on_budget: training %d of %d steps", budget, steps)
    return budget


def _loggers(
    cfg: DictConfig, run_dir: Path, method: str, tags: list[str], saved: SavedRun | None, wandb_id: str | None,
    sweep_dir: Path | None,
) -> list[Logger]:
    loggers: list[Logger] = []
    if cfg.logger.csv:
        loggers.append(HistoryCSVLogger(str(run_dir), saved.log_step if saved else None))
    if wandb_id is not None:
        loggers.append(wandb_logger(cfg, run_dir, method, tags, wandb_id, sweep_dir))
    return loggers


def _wandb_id(cfg: DictConfig, saved: SavedRun | None) -> str | None:
    """The W&B run to log into: the interrupted run's on resume, so its history continues in one run."""
    if not cfg.logger.wandb or os.environ.get("WANDB_MODE", "offline") == "disabled":
        return None
    if saved is not None and saved.wandb_id:
        return saved.wandb_id
    return secrets.token_hex(4)


@dataclass
class PreparedRun:
    """Everything a run fixes before its first step: what `dpbench.plan` prints and `run_experiment` trains."""

    config: Config
    data: DataBundle
    datamodule: DPDataModule
    randomness: PrivacyRandomness
    strategy: PrivatizerStrategy
    model: nn.Module
    plan: PrivacyPlan
    steps: int
    budget_steps: int
    host_memory: str
    """What the host allocator does with freed memory in this process (training/host_memory.py)."""
    method: str
    """The method named with its optimizer and the keys that make it a variant: "DP-SGD-JL (r=5)"."""
    memory: MemoryEstimate


def prepare_run(cfg: DictConfig, memory_check: bool = True) -> PreparedRun:
    """Compose data, privatizer, model and the privacy plan exactly as a run does, without training.
    `memory_check=False`: estimate the memory but refuse nothing on it (a finished run's resume trains nothing)."""
    typed: Config = validated(Config, cfg, "top-level")
    if typed.trainer.num_threads:
        torch.set_num_threads(typed.trainer.num_threads)
    host_memory = keep_freed_host_memory() if typed.trainer.keep_freed_host_memory else DEFAULTS
    check_run_settings(typed)
    L.seed_everything(typed.seed, workers=True, verbose=False)  # public: init, dropout; never privacy draws
    randomness = PrivacyRandomness(typed.privacy.seed, typed.privacy.secure_rng)
    STRATEGIES.check(cfg.privatizer)  # a typo is refused before the data loads (building needs the sampling rate)
    MODELS.check(cfg.model)

    data = load_data(cfg.data)
    if typed.batch_size > len(data.train):
        raise ConfigurationError(f"batch_size {typed.batch_size} exceeds the training set size {len(data.train)}")
    micro_batch = typed.physical_batch_size or typed.batch_size
    eval_batch = typed.eval_batch_size or micro_batch
    datamodule = DPDataModule(data, typed.batch_size, typed.privacy.sampling, randomness, eval_batch)
    steps = typed.max_steps or typed.epochs * datamodule.steps_per_epoch
    sampling_rate = datamodule.sampling_rate
    privacy = PrivacySettings(typed.privacy.clip_norm, sampling_rate, typed.privacy.noise_multiplier, randomness)
    strategy = make_strategy(cfg.privatizer, privacy)
    check_strategy_precision(strategy, str(typed.trainer.precision))
    check_strategy_sharding(strategy, str(typed.trainer.strategy))
    model = build_model(cfg.model, data)
    strategy.preflight(model, typed.optimizer)
    memory = estimate_memory(model, data, strategy, typed.optimizer, micro_batch, eval_batch, _run_device(typed))
    if typed.trainer.memory_check and memory_check:
        check_fits(memory, typed.batch_size)
    plan = make_plan(strategy, typed.privacy, sampling_rate, steps, model, len(data.train))
    budget_steps = _steps_within_budget(typed, plan, strategy, steps)
    method = with_precision(with_variant(method_label(strategy.name, typed.optimizer.name), options(cfg.privatizer)),
                            str(typed.trainer.precision))
    return PreparedRun(typed, data, datamodule, randomness, strategy, model, plan, steps, budget_steps, host_memory,
                       method, memory)


def _run_device(typed: Config) -> torch.device:
    """Where the run will train (per rank): a CUDA device when the accelerator may take one, else the host."""
    cuda = typed.trainer.accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))  # each rank of a group checks the GPU Lightning gives it
    return torch.device("cuda", local_rank % torch.cuda.device_count()) if cuda else torch.device("cpu")


def _trainer(
    typed: Config, callbacks: list[L.Callback], loggers: list[Logger], max_steps: int, run_dir: Path,
) -> L.Trainer:
    accelerator = typed.trainer.accelerator
    progress = shows_progress(typed.trainer.enable_progress_bar)
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())
    ranks = typed.trainer.devices * typed.trainer.num_nodes if isinstance(typed.trainer.devices, int) else None
    if on_cpu and ranks is not None and ranks > (os.cpu_count() or 1):
        log.warning("trainer.devices=%d starts %d training processes on this machine's %d CPU cores: they share the "
                    "cores (slower than one process) and each holds a copy of the model", typed.trainer.devices,
                    ranks, os.cpu_count() or 1)
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ConfigurationError(
            f"trainer.accelerator={accelerator} but this machine has no CUDA GPU visible to torch "
            f"(torch {torch.__version__}): use trainer.accelerator=auto or cpu"
        )
    try:
        return L.Trainer(
            accelerator=accelerator,
            devices=typed.trainer.devices,
            strategy=lightning_strategy(typed.trainer.strategy, typed.trainer.devices, typed.trainer.num_nodes),
            num_nodes=typed.trainer.num_nodes,
            precision=typed.trainer.precision,
            max_epochs=-1 if typed.max_steps else typed.epochs,
            max_steps=max_steps,
            logger=loggers or False,
            callbacks=[*callbacks, RunProgressBar()] if progress else callbacks,
            enable_checkpointing=False,  # PeriodicCheckpoint writes them
            enable_progress_bar=progress,  # Lightning's per-epoch bars never: ours covers the run, on a terminal
            enable_model_summary=False,
            log_every_n_steps=typed.trainer.log_every_n_steps,
            check_val_every_n_epoch=typed.trainer.check_val_every_n_epoch,
            num_sanity_val_steps=0,
            use_distributed_sampler=False,
            default_root_dir=str(run_dir),
            plugins=[AtomicCheckpointIO()],
        )
    except (MisconfigurationException, ValueError, RuntimeError) as error:
        raise ConfigurationError(
            f"the trainer.* settings are not usable on this machine: {str(error).splitlines()[0]}"
        ) from None


def _with_saved_noise(cfg: DictConfig, saved: SavedRun) -> DictConfig:
    """extend_run: the longer schedule keeps the checkpoint's sigma instead of recalibrating it."""
    extended = cfg.copy()
    extended.privacy.noise_multiplier = saved.plan["noise_multiplier"]
    return extended



def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)


def run_experiment(cfg: DictConfig, run_dir: Path, sweep_dir: Path | None = None) -> RunResults:
    """Train, test and write results.json in run_dir; returns the results. sweep_dir: the multirun this run is a
    job of (W&B groups the sweep's runs by it)."""
    drop_lightning_console()
    with library_warnings_to_log():
        return _run_experiment(cfg, Path(run_dir), sweep_dir)


@dataclass
class Resumption:
    """What the run directory already holds: a checkpoint to continue, and the results of a run that finished."""

    checkpoint: Path
    finished: RunResults | None
    resume_from: Path | None
    saved: SavedRun | None
    extend: bool


@dataclass
class TrainingSession:
    """The trainer of one run with the callbacks whose figures results.json reports."""

    trainer: L.Trainer
    profiler: ProfilerCallback
    epsilon_logger: EpsilonLogger | None
    checkpointing: PeriodicCheckpoint | None
    signals: StopSignals
    method: str


@dataclass
class Evaluation:
    tested: dict[str, float]
    validated: dict[str, float]
    wall_s: float


def _run_experiment(cfg: DictConfig, run_dir: Path, sweep_dir: Path | None) -> RunResults:
    run_dir.mkdir(parents=True, exist_ok=True)
    resumption = _resumption(cfg, run_dir)
    if resumption.finished is not None and not resumption.checkpoint.exists():
        return _unchanged(resumption.finished, run_dir)
    saved, extend = resumption.saved, resumption.extend
    prepared = prepare_run(_with_saved_noise(cfg, saved) if extend and saved.plan["private"] else cfg,
                           memory_check=resumption.finished is None)
    log.info("model=%s: %s parameters", cfg.model.name, f"{_count(prepared.model.parameters()):,}")
    if saved is not None:
        check_resume(saved, prepared.plan.to_dict(), public_config(cfg), extend)
        if _ran_to_its_end(resumption, prepared):
            return _unchanged(resumption.finished, run_dir)
        log.info("resuming the run in %s from step %s of %d (%s)", run_dir, saved.step, prepared.budget_steps,
                 resumption.resume_from)
    ledger = PrivacyLedger(prepared.config.privacy.delta,
                           PrivacyAccountant(eps_error=prepared.config.privacy.accountant_eps_error),
                           declared_composition(prepared.strategy, prepared.plan))
    module = _lightning_module(prepared, ledger)
    session = _training_session(cfg, prepared, ledger, resumption, run_dir, sweep_dir)
    evaluation = _fit_and_evaluate(session, module, prepared, ledger, resumption, cfg, run_dir)
    results = _results(cfg, prepared, ledger, session, evaluation, resumption, run_dir)
    if session.trainer.is_global_zero:  # the ledger is identical on every rank: rank 0 reports it once
        _publish(results, ledger, prepared.strategy, session.trainer.loggers, run_dir)
    return results


def _resumption(cfg: DictConfig, run_dir: Path) -> Resumption:
    checkpoint = checkpoint_path(run_dir)
    finished = finished_results(run_dir) if resume_mode(cfg.resume) != "false" else None
    if finished is not None and not checkpoint.exists():  # trainer.checkpoint=false: it cannot have grown
        return Resumption(checkpoint, finished, None, None, extend=False)
    resume_from = checkpoint_to_resume(cfg.resume, checkpoint)
    saved = read_saved_run(resume_from) if resume_from else None
    return Resumption(checkpoint, finished, resume_from, saved, bool(cfg.get("extend_run")) and saved is not None)


def _ran_to_its_end(resumption: Resumption, prepared: PreparedRun) -> bool:
    """A finished run's checkpoint at its last step: nothing to train (its privacy root is still checked)."""
    saved = resumption.saved
    if resumption.finished is None or saved is None or saved.step is None or saved.step < prepared.budget_steps:
        return False
    if saved.randomness is not None:  # a different privacy.seed or secure_rng is refused, as on any resume
        prepared.randomness.load_state_dict(saved.randomness)
    return True


def _count(parameters: Iterable[nn.Parameter]) -> int:
    return sum(p.numel() for p in parameters)


def _lightning_module(prepared: PreparedRun, ledger: PrivacyLedger) -> DPModule:
    typed, data, plan = prepared.config, prepared.data, prepared.plan
    if plan.private and typed.logger.train_stats:
        log.warning("logger.train_stats=true: the per-step train/* metrics come from the private batches without "
                    "noise, outside the (epsilon, delta) guarantee")
    return DPModule(
        prepared.model, data.task, prepared.strategy, typed.optimizer, ledger, typed.batch_size,
        typed.physical_batch_size, train_stats(typed, plan.private),
        "val" if data.validation is not None else "val_on_test",
    )


def _training_session(cfg: DictConfig, prepared: PreparedRun, ledger: PrivacyLedger, resumption: Resumption,
                      run_dir: Path, sweep_dir: Path | None) -> TrainingSession:
    typed, plan, strategy, saved = prepared.config, prepared.plan, prepared.strategy, resumption.saved
    method = prepared.method
    paper = off_paper(strategy.name, typed.optimizer.name)
    if paper:
        log.warning("privatizer=%s with optimizer=%s: its paper's method uses optimizer=%s; this run is labelled %s",
                    strategy.name, typed.optimizer.name, paper, method)
    profiler = ProfilerCallback(typed.profiler.warmup_steps, typed.batch_size if plan.private else None,
                                typed.batch_size)
    epsilon_logger = EpsilonLogger(ledger) if plan.private else None
    wandb_id = _wandb_id(cfg, saved)
    signals = StopSignals()
    checkpointing = None
    if typed.trainer.checkpoint:
        frozen_plan = plan.to_dict()
        if resumption.extend:
            frozen_plan["calibrated"] = saved.plan["calibrated"]
        checkpointing = PeriodicCheckpoint(
            resumption.checkpoint, typed.trainer.checkpoint_every_n_steps, typed.trainer.checkpoint_every_minutes,
            signals, {"plan": frozen_plan, "config": public_config(cfg), "wandb_id": wandb_id},
        )
    callbacks = [c for c in (profiler, epsilon_logger, checkpointing) if c is not None]
    tags = [strategy.name, cfg.model.name, prepared.data.name]
    trainer = _trainer(typed, callbacks, _loggers(cfg, run_dir, method, tags, saved, wandb_id, sweep_dir),
                       prepared.budget_steps, run_dir)
    return TrainingSession(trainer, profiler, epsilon_logger, checkpointing, signals, method)


def _fit_and_evaluate(session: TrainingSession, module: DPModule, prepared: PreparedRun, ledger: PrivacyLedger,
                      resumption: Resumption, cfg: DictConfig, run_dir: Path) -> Evaluation:
    """Fit, then test and validate the last model; a stop signal, OOM or failed per-sample check ends it here."""
    trainer, signals, typed = session.trainer, session.signals, prepared.config
    saved_to = resumption.checkpoint if session.checkpointing else None
    resume_from = resumption.resume_from
    started = time.perf_counter()
    with warnings.catch_warnings(), signals:
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        warnings.filterwarnings("ignore", ".*TensorBoard.*")
        warnings.filterwarnings("ignore", ".*resuming from a checkpoint that ended before the epoch ended.*")
        try:
            trainer.fit(module, datamodule=prepared.datamodule, ckpt_path=str(resume_from) if resume_from else None,
                        weights_only=True)
        except (torch.OutOfMemoryError, MemoryError) as error:
            raise ConfigurationError(
                f"out of memory at batch_size={typed.batch_size} ({type(error).__name__}). Keep the logical batch "
                f"(and the privacy guarantee) and run it in micro-batches: physical_batch_size="
                f"{max(1, typed.batch_size // 4)} (noise is still added once per logical batch)"
            ) from None
        except SIGTERMException:  # Lightning's own SIGTERM exit (code 0) after our checkpoint at the epoch's end
            raise RunInterrupted(signal.SIGTERM, trainer.global_step, saved_to) from None
        except PerSampleMismatch as mismatch:
            if trainer.is_global_zero:
                _record_mismatch(run_dir, prepared.strategy, ledger, mismatch, public_config(cfg))
            raise
        wall = time.perf_counter() - started
        signals.stop_if_received(trainer.global_step, saved_to)
        tested = trainer.test(module, datamodule=prepared.datamodule, verbose=False)[0]
        validated = (trainer.validate(module, datamodule=prepared.datamodule, verbose=False)[0]
                     if prepared.data.validation else {})
        signals.stop_if_received(trainer.global_step, saved_to)
    return Evaluation(tested, validated, wall)


def _publish(results: RunResults, ledger: PrivacyLedger, strategy: PrivatizerStrategy, loggers: list[Logger],
             run_dir: Path) -> None:
    """results.json, the ledger, W&B's summary, and the one-screen summary."""
    if results.private:
        write_json_atomic(run_dir / LEDGER_FILE, ledger.to_json(strategy.name))
    write_results(run_dir, results)
    upload = finish_wandb(loggers, results.to_json())
    print(summary_text(results), flush=True)
    if upload:
        print(f"W&B run saved offline; to upload it: {upload}", flush=True)


def _results(cfg: DictConfig, prepared: PreparedRun, ledger: PrivacyLedger, session: TrainingSession,
             evaluation: Evaluation, resumption: Resumption, run_dir: Path) -> RunResults:
    """The record of the run; long because it names every field of the schema once."""
    typed, data, plan, strategy, saved = (prepared.config, prepared.data, prepared.plan, prepared.strategy,
                                          resumption.saved)
    trainer, profiler, epsilon_logger = session.trainer, session.profiler, session.epsilon_logger
    report = ledger.epsilon() if plan.private else None
    if report and (not ledger.epsilon_history or ledger.epsilon_history[-1][0] != ledger.steps):
        ledger.epsilon_history.append((ledger.steps, report.epsilon))  # resumed past its last epoch's end
    metric, bound = data.task.metric_name, score_bound_of(data.task)
    memory = profiler.memory
    checkpointing = session.checkpointing
    return RunResults(
        method=session.method,
        privatizer=strategy.name,
        optimizer=typed.optimizer.name,
        model=cfg.model.name,
        parameters=_count(prepared.model.parameters()),
        trainable_parameters=_count(p for p in prepared.model.parameters() if p.requires_grad),
        data=data.name,
        private=plan.private,
        device=_device_name(trainer.strategy.root_device),  # the module is back on the CPU once fit returns
        precision=str(typed.trainer.precision),
        seed=typed.seed,
        run_dir=str(run_dir),
        config=_published_config(cfg, prepared.randomness),
        method_details=strategy.method_details(prepared.model),
        epsilon=report.epsilon if report else None,
        epsilon_estimate=report.epsilon_estimate if report else None,
        accountant_method=report.method if report else None,
        accountant_fallback_reason=report.fallback_reason if report else None,
        ledger_underreported=ledger.underreported.to_dict() if report and ledger.underreported else None,
        noise_multiplier_source=noise_multiplier_source(typed.privacy) if plan.private else None,
        target_epsilon=typed.privacy.epsilon if plan.private and plan.calibrated else None,
        planned_epsilon=plan.planned_epsilon,
        calibration_floor_hit=plan.floor_hit,
        delta=typed.privacy.delta if plan.private else None,
        noise_multiplier=plan.noise_multiplier,
        clip_norm=plan.clip_norm,
        sampling=plan.sampling,
        sampling_rate=plan.sampling_rate,
        secure_rng=typed.privacy.secure_rng,
        privacy_seed="explicit (secret, not recorded)" if prepared.randomness.explicit else "drawn from the OS",
        outside_guarantee=_outside_guarantee(typed, plan.private),
        per_sample_check=strategy.checks.report() if plan.private else None,
        epsilon_caveat=strategy.checks.caveat() if plan.private else None,
        accounting_note=None if plan.sampling == "poisson" else (
            "shuffled fixed-size batches: the epsilon is the Poisson-subsampling figure, which such batches do "
            "not strictly satisfy"),
        batch_size=typed.batch_size,
        train_size=len(data.train),
        test_size=len(data.test),
        validation_size=len(data.validation) if data.validation else 0,
        steps=ledger.steps if plan.private else trainer.global_step,
        epochs=math.ceil(trainer.global_step / prepared.datamodule.steps_per_epoch),  # also right after a resume
        planned_steps=prepared.steps,
        stopped_on_budget=prepared.budget_steps < prepared.steps,
        resumed_from_step=saved.step if saved else None,
        extended_run=_extension_report(saved, report.epsilon if report else None) if resumption.extend else None,
        test_metric=metric,
        test_score=float(evaluation.tested[f"test/{metric}"]),
        test_loss=float(evaluation.tested["test/loss"]),
        validation_score=float(evaluation.validated[f"val/{metric}"]) if evaluation.validated else None,
        validation_capped_loss=(float(evaluation.validated["val/capped_loss"])
                                if evaluation.validated and bound is not None else None),
        score_bound=bound,
        samples_per_s=profiler.samples_per_s,
        step_time_s=profiler.summary().get("profile/step_time_s"),
        peak_memory_mb=(sum(profiler.rank_peaks_mb) if profiler.rank_peaks_mb else profiler.peak_mb),
        rank_peak_memory_mb=profiler.rank_peaks_mb,
        rank_memory_at_start_mb=profiler.rank_starts_mb,
        resident_peak_mb=memory.peak_mb if memory and memory.device.type == "cpu" else None,
        max_memory_reserved_mb=memory.max_memory_reserved_mb if memory else None,
        max_memory_allocated_mb=memory.max_memory_allocated_mb if memory else None,
        memory_method=profiler.memory_method,
        page_faults_per_step=profiler.page_faults_per_step,
        host_memory=prepared.host_memory,
        train_time_s=evaluation.wall_s - (epsilon_logger.seconds if epsilon_logger else 0.0),  # not accounting's
        epsilon_log_time_s=epsilon_logger.seconds if epsilon_logger else None,
        checkpoint_time_s=(sum(checkpointing.save_seconds) if checkpointing and checkpointing.save_seconds
                           else None),
        profile_note=None if saved is None else (
            f"samples_per_s, step_time_s, train_time_s and peak memory cover this process only: the steps after "
            f"{saved.step}"),
        strategy_figures=strategy.privacy_report(ledger.steps, typed.privacy.delta) if plan.private else {},
    )


def _published_config(cfg: DictConfig, randomness: PrivacyRandomness) -> dict[str, Any]:
    """A resume that left privacy.seed out continued the checkpoint's root, explicit if the run's was."""
    config = public_config(cfg)
    if randomness.explicit:
        config["privacy"]["seed"] = SECRET
    return config


def _unchanged(results: RunResults, run_dir: Path) -> RunResults:
    """Resuming a run that already ran to its end: nothing to train, and its results stay as they are."""
    print(f"dpbench: the run in {run_dir} is finished ({results.steps} steps): nothing to resume, "
          f"results.json unchanged (a longer epochs= or max_steps= with extend_run=true continues it)", flush=True)
    return results


def _record_mismatch(
    run_dir: Path, strategy: PrivatizerStrategy, ledger: PrivacyLedger, mismatch: PerSampleMismatch,
    config: dict[str, Any],
) -> None:
    """A run stopped by a failed per-sample check: its steps were clipped wrongly, so no epsilon is claimed."""
    spent = ledger.epsilon().epsilon if ledger.steps else None
    write_results(run_dir, StoppedRun(
        privatizer=strategy.name,
        stopped=f"per-sample check failed at step {mismatch.step}",
        error=str(mismatch),
        epsilon_caveat=(f"not a guarantee: the {ledger.steps} steps taken were clipped with per-sample gradients "
                        f"found wrong for {', '.join(mismatch.parameters)}; the accountant's figure for them was "
                        f"{spent}"),
        steps=ledger.steps,
        per_sample_check=strategy.checks.report(),
        config=config,
    ))


def _extension_report(saved: SavedRun, epsilon: float | None) -> dict[str, Any]:
    """extend_run: the schedule grew at the checkpoint's sigma, so the original target may be exceeded."""
    target = saved.config.get("privacy", {}).get("epsilon") if saved.plan["calibrated"] else None
    if not saved.plan["private"]:
        return {"planned_steps_before": saved.plan["steps"]}
    return {
        "planned_steps_before": saved.plan["steps"],
        "noise_multiplier": saved.plan["noise_multiplier"],
        "target_epsilon": target,
        "target_exceeded": target is not None and epsilon is not None and epsilon > target,
    }


def _outside_guarantee(typed: Config, private: bool) -> list[str]:
    """What the run publishes from the private training data without noise: outside the (epsilon, delta) claim."""
    if not private:
        return []
    if train_stats(typed, private):
        return ["train/* metrics in the CSV and W&B logs (per-step loss, realised batch size, gradient norms, clip "
                "fractions): logger.train_stats=true; the default (null) keeps them off for private runs"]
    return []


def train_stats(typed: Config, private: bool) -> bool:
    """logger.train_stats, whose default (null) logs them for non-private runs only."""
    return typed.logger.train_stats if typed.logger.train_stats is not None else not private

