"""Hydra entry point: `python -m dpbench [+experiment=NAME] [key=value ...]` and `-m` sweeps."""

from __future__ import annotations

import multiprocessing
import signal
import sys
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from dpbench.config import register_schemas
from dpbench.errors import ConfigurationError, RunInterrupted
from dpbench.registry import register_config_groups


def config_dir() -> str:
    """conf/ at the top of a checkout, or dpbench/conf inside an installed wheel."""
    package = Path(__file__).resolve().parent
    for candidate in (package / "conf", package.parent / "conf"):
        if (candidate / "config.yaml").exists():
            return str(candidate)
    raise FileNotFoundError("dpbench's conf/ directory was not found beside the package")


def _child(container: dict, run_dir: str, errors: multiprocessing.Queue) -> None:
    from dpbench.run import run_experiment

    try:
        run_experiment(OmegaConf.create(container), Path(run_dir))
    except ConfigurationError as error:
        errors.put(("config", str(error)))
        sys.exit(2)
    except RunInterrupted as interrupted:
        checkpoint = str(interrupted.checkpoint) if interrupted.checkpoint else None
        errors.put(("interrupted", (interrupted.signum, interrupted.step, checkpoint)))
        sys.exit(interrupted.exit_code)
    except BaseException:
        errors.put(("crash", traceback.format_exc()))
        sys.exit(1)


def _run_in_fresh_process(cfg: DictConfig, run_dir: Path) -> float | None:
    """Peak memory of a job is only its own in a new process (multirun jobs share one otherwise)."""
    from dpbench.results import read_results

    context = multiprocessing.get_context("spawn")
    errors = context.Queue()
    process = context.Process(target=_child, args=(OmegaConf.to_container(cfg, resolve=True), str(run_dir), errors))
    process.start()
    forward = signal.signal(signal.SIGTERM, lambda signum, frame: process.terminate())  # the job checkpoints, stops
    ignore = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C reaches the job itself
    try:
        process.join()
    finally:
        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, ignore)
    if process.exitcode != 0:
        kind, message = errors.get(timeout=5) if not errors.empty() else ("crash", f"exit code {process.exitcode}")
        if kind == "config":
            raise ConfigurationError(message)
        if kind == "interrupted":
            signum, step, checkpoint = message
            raise RunInterrupted(signum, step, Path(checkpoint) if checkpoint else None)
        raise RuntimeError(f"the run in {run_dir} failed:\n{message}")
    return objective_value(read_results(run_dir))


def objective_value(results: dict) -> float | None:
    """What sweepers optimize: the validation metric when a validation split exists, else the test metric."""
    metric = results["test_metric"]
    validation = results.get(f"validation_{metric}")
    return validation if validation is not None else results.get(f"test_{metric}")


def _objective(cfg: DictConfig) -> float | None:
    from dpbench.results import REFUSED_FILE

    hydra_config = HydraConfig.get()
    run_dir = Path(hydra_config.runtime.output_dir)
    (run_dir / REFUSED_FILE).unlink(missing_ok=True)  # an earlier refusal of this job is no longer the news
    _redact_privacy_seed(hydra_config)
    mode = cfg.profiler.fresh_process
    if mode not in ("always", "multirun", "never"):
        raise ConfigurationError(f"profiler.fresh_process must be always, multirun or never, got {mode!r}")
    if mode == "always" or (mode == "multirun" and hydra_config.mode == RunMode.MULTIRUN):
        return _run_in_fresh_process(cfg, run_dir)
    from dpbench.run import run_experiment

    return objective_value(run_experiment(cfg, run_dir))


def _redact_privacy_seed(hydra_config: DictConfig) -> None:
    """Before anything else runs: the seed out of Hydra's saved configs (the job's, the sweep's) and out of argv,
    which W&B records (a multirun's fresh job process inherits it), however the command line spelled it."""
    from dpbench.redaction import redact_overrides, redact_saved_configs

    sys.argv[:] = redact_overrides(sys.argv)
    if hydra_config.output_subdir is not None:
        redact_saved_configs(Path(hydra_config.runtime.output_dir) / hydra_config.output_subdir)
    if hydra_config.mode == RunMode.MULTIRUN:
        redact_saved_configs(Path(hydra_config.sweep.dir))


def _record_refusal(message: str) -> None:
    """refused.json in the job's directory: the sweep report lists it beside the runs."""
    from dpbench.redaction import redact_overrides
    from dpbench.results import REFUSED_FILE, write_json_atomic

    hydra_config = HydraConfig.get()
    write_json_atomic(Path(hydra_config.runtime.output_dir) / REFUSED_FILE,
                      {"overrides": redact_overrides(hydra_config.overrides.task), "error": message})


register_schemas()
register_config_groups(config_dir())


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="config")
def main(cfg: DictConfig) -> float | None:
    try:
        return _objective(cfg)
    except ConfigurationError as error:
        from dpbench.redaction import redact_value

        message = redact_value(str(error), cfg.privacy.get("seed"))  # e.g. an invalid seed, quoted
        print(f"dpbench: error: {message}", file=sys.stderr)
        if HydraConfig.get().mode == RunMode.MULTIRUN:  # one refused job must not end the sweep: record it
            _record_refusal(message)
            return None
        sys.exit(2)
    except RunInterrupted as interrupted:
        print(f"dpbench: {interrupted}", file=sys.stderr)
        sys.exit(interrupted.exit_code)
    except KeyboardInterrupt:
        print("dpbench: interrupted outside training: no new checkpoint was written", file=sys.stderr)
        sys.exit(128 + signal.SIGINT)
