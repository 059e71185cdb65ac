"""Hydra entry point: `python -m dpbench [+experiment=NAME] [key=value ...]` and `-m` sweeps."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from dpbench.app.cli_errors import from_the_job, one_line_errors
from dpbench.app.hydra_setup import config_dir, setup
from dpbench.app.stop_relay import RELAY
from dpbench.core.errors import ConfigurationError, RunInterrupted


def _objective(cfg: DictConfig) -> float | None:
    from dpbench.core.results import REFUSED_FILE
    from dpbench.training.resume import config_to_resume

    hydra_config = HydraConfig.get()
    run_dir = Path(hydra_config.runtime.output_dir)
    (run_dir / REFUSED_FILE).unlink(missing_ok=True)  # an earlier refusal of this job is no longer the news
    _redact_privacy_seed(hydra_config)
    cfg = config_to_resume(cfg, run_dir, list(hydra_config.overrides.task))
    mode = cfg.profiler.fresh_process
    if mode not in ("always", "multirun", "never"):
        raise ConfigurationError(f"profiler.fresh_process must be always, multirun or never, got {mode!r}")
    sweep_dir = Path(hydra_config.sweep.dir) if hydra_config.mode == RunMode.MULTIRUN else None
    if mode == "always" or (mode == "multirun" and sweep_dir is not None):
        from dpbench.app.job_process import run_in_fresh_process
        from dpbench.core.results import read_results

        job_logging = OmegaConf.to_container(hydra_config.job_logging, resolve=True)
        run_in_fresh_process(cfg, run_dir, sweep_dir, job_logging)
        return read_results(run_dir).objective
    from dpbench.app.run import run_experiment

    return run_experiment(cfg, run_dir, sweep_dir).objective


def _redact_privacy_seed(hydra_config: DictConfig) -> None:
    """Before anything else runs: the seed out of Hydra's saved configs (the job's, the sweep's) and out of argv,
    which W&B records (a multirun's fresh job process inherits it), however the command line spelled it."""
    from dpbench.core.redaction import argv_without_seed, redact_saved_configs

    sys.argv[:] = argv_without_seed(sys.argv)
    if hydra_config.output_subdir is not None:
        redact_saved_configs(Path(hydra_config.runtime.output_dir) / hydra_config.output_subdir)
    if hydra_config.mode == RunMode.MULTIRUN:
        redact_saved_configs(Path(hydra_config.sweep.dir))


def _record_refusal(message: str) -> None:
    """refused.json in the job's directory: the sweep report lists it beside the runs."""
    from dpbench.core.redaction import redact_overrides
    from dpbench.core.results import REFUSED_FILE, write_json_atomic

    hydra_config = HydraConfig.get()
    write_json_atomic(Path(hydra_config.runtime.output_dir) / REFUSED_FILE,
                      {"overrides": redact_overrides(hydra_config.overrides.task), "error": message})


def main() -> None:
    """`python -m dpbench`; Hydra's own configuration errors as one line with exit 2 (see dpbench.app.cli_errors). Every
    file and directory a run creates is at most 0644 / 0755 whatever the umask (secrets are 0600 on their own)."""
    os.umask(os.umask(0o022) | 0o022)
    setup()
    with one_line_errors("dpbench", sys.argv[1:]):
        _hydra_main()


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="config")
def _hydra_main(cfg: DictConfig) -> float | None:
    try:
        return _job(cfg)
    except Exception as error:
        from_the_job(error)
        raise


def _job(cfg: DictConfig) -> float | None:
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    if multirun and RELAY.received:  # stopped between jobs: this one does not start
        _stop_sweep(RELAY.received)
    try:
        objective = _objective(cfg)
    except ConfigurationError as error:
        from dpbench.core.redaction import redact_value

        message = redact_value(str(error), cfg.privacy.get("seed"))  # e.g. an invalid seed, quoted
        print(f"dpbench: error: {message}", file=sys.stderr)
        if not multirun:
            sys.exit(2)
        _record_refusal(message)  # one refused job must not end the sweep: record it
        objective = None
    except RunInterrupted as interrupted:
        print(f"dpbench: {interrupted}", file=sys.stderr)
        if multirun:
            _stop_sweep(interrupted.signum)
        sys.exit(interrupted.exit_code)
    except KeyboardInterrupt:
        print("dpbench: interrupted outside training: no new checkpoint was written", file=sys.stderr)
        if multirun:
            _stop_sweep(signal.SIGINT)
        sys.exit(128 + signal.SIGINT)
    if multirun and RELAY.received:  # the job finished, but no other may start
        _stop_sweep(RELAY.received)
    return objective


def _stop_sweep(signum: int) -> None:
    """Leave the sweep now (Hydra's launcher would start the next job): the report of what finished, and how to
    continue."""
    from dpbench.report.callback import end_sweep

    RELAY.restore()
    end_sweep(Path(HydraConfig.get().sweep.dir), signum)
