"""`python -m dpbench.plan [the overrides of a run]`: each job's sigma, q, steps and epsilon, without training.

Hydra composes the config exactly as `python -m dpbench` does (the same conf dir, schema and plugin config groups;
`--config-dir`, `--config-name`, `+experiment=...`, `hydra.searchpath`), and a `-m` grid is expanded by Hydra's own
basic-sweeper rules into one job per line. Each job then goes through `dpbench.app.run.prepare_run` (data, privatizer,
model, noise calibration) and the privatizer is attached to the model, so a config a run would refuse is refused
here. Nothing is trained, no output directory is created and no Hydra callback (such as the sweep report) runs.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
from collections.abc import Iterator

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra._internal.hydra import Hydra
from hydra._internal.utils import (
    get_args_parser,
    run_and_report,
)
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict

from dpbench.app.cli_errors import one_line_errors
from dpbench.app.hydra_setup import main_hydra
from dpbench.core.errors import ConfigurationError

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def job_configs(args: argparse.Namespace, hydra: Hydra) -> Iterator[tuple[str, DictConfig]]:
    """(the job's overrides, its config with the hydra node) for the run, or for every job of a -m grid."""
    name = args.config_name or "config"
    overrides = list(args.overrides)
    mode = hydra.get_mode(config_name=name, overrides=overrides)
    if mode is None:
        mode = RunMode.MULTIRUN if args.multirun else RunMode.RUN
        overrides.append(f"hydra.mode={mode.name}")
    elif args.multirun and mode == RunMode.RUN:
        mode = RunMode.MULTIRUN
        overrides.append("hydra.mode=MULTIRUN")
    if mode == RunMode.RUN:
        cfg = hydra.compose_config(config_name=name, overrides=overrides, run_mode=RunMode.RUN)
        yield " ".join(args.overrides), cfg
        return
    master = hydra.compose_config(config_name=name, overrides=overrides, run_mode=RunMode.MULTIRUN)
    sweeper = master.hydra.sweeper
    if sweeper.get("_target_") != BASIC_SWEEPER:
        raise ConfigurationError(f"dpbench.plan expands grids of Hydra's basic sweeper; hydra.sweeper is "
                                 f"{sweeper.get('_target_')} (a search, whose jobs are not known in advance)")
    params = [f"{key}={value}" for key, value in (sweeper.get("params") or {}).items()]
    arguments = params + list(OmegaConf.to_container(master.hydra.overrides.task, resolve=False))
    parsed = OverridesParser.create(config_loader=hydra.config_loader).parse_overrides(arguments)
    for number, job in enumerate(BasicSweeper.split_arguments(parsed, None)[0]):
        cfg = hydra.config_loader.load_sweep_config(master, list(job))
        with open_dict(cfg):
            cfg.hydra.job.num = number
        yield " ".join(job), cfg


def plan_line(cfg: DictConfig) -> str:
    """One job's privacy plan as a line: what `prepare_run` fixes before the first step of a run."""
    from dpbench.app.run import prepare_run
    from dpbench.core.methods import with_privatizer
    from dpbench.privacy.accountant import PrivacyAccountant

    task = copy.deepcopy(cfg)
    with open_dict(task):
        del task["hydra"]
    prepared = prepare_run(task)
    prepared.strategy.attach(prepared.model)
    plan, privacy = prepared.plan, prepared.config.privacy
    method = with_privatizer(prepared.method, prepared.strategy.name)
    what = f"{method} on {prepared.data.name} / {task.model.name}:"
    steps = f"steps={prepared.budget_steps}" + (
        f" (stop_on_budget: of {prepared.steps})" if prepared.budget_steps < prepared.steps else "")
    if not plan.private:
        return (f"{what} not private (no noise): epsilon=inf q={plan.sampling_rate:.6g} {steps}; "
                f"{prepared.memory.describe()}")
    epsilon = plan.planned_epsilon
    if prepared.budget_steps < prepared.steps:
        composition = prepared.strategy.composition(plan.noise_multiplier, prepared.budget_steps)
        epsilon = PrivacyAccountant(eps_error=privacy.accountant_eps_error).epsilon(composition, plan.delta).epsilon
    line = (f"{what} sigma={plan.noise_multiplier:.6g} q={plan.sampling_rate:.6g} {steps} "
            f"epsilon={epsilon:.4g} delta={plan.delta:g}")
    if not math.isfinite(epsilon):
        composition = prepared.strategy.composition(plan.noise_multiplier, prepared.budget_steps)
        report = PrivacyAccountant(eps_error=privacy.accountant_eps_error).epsilon(composition, plan.delta)
        line += f" (infinite: {report.fallback_reason or 'the composition has no finite bound at this delta'})"
    if plan.calibrated:
        line += f" (calibrated to privacy.epsilon={privacy.epsilon:g})"
    if plan.sampling != "poisson":
        line += (f" [sampling={plan.sampling}: the Poisson-subsampling figure, which such batches do not strictly "
                 "satisfy]")
    return f"{line}; {prepared.memory.describe()}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with one_line_errors("dpbench.plan", argv):
        return _plan(argv)


def _plan(argv: list[str]) -> int:
    parser = get_args_parser()
    parser.prog = "python -m dpbench.plan"
    args = parser.parse_args(argv)
    if args.help:
        print(__doc__.strip() + "\n\nusage: python -m dpbench.plan [-m] [--config-dir DIR] [--config-name NAME] "
              "[key=value ...]")
        return 0
    refused = failed = 0
    try:
        hydra = run_and_report(lambda: main_hydra(args))
        jobs = run_and_report(lambda: list(job_configs(args, hydra)))
        for number, (overrides, cfg) in enumerate(jobs):
            label = f"[{number}] {overrides}".rstrip() if len(jobs) > 1 else (overrides or "(defaults)")
            try:
                print(f"{label}: {plan_line(cfg)}", flush=True)
            except ConfigurationError as error:
                refused += 1
                print(f"{label}: refused: {error}", flush=True)
            except Exception as error:  # a plugin's own bug: the other jobs of the grid still get their line
                failed += 1
                print(f"{label}: failed: {type(error).__name__}: {error}", flush=True)
    except ConfigurationError as error:
        print(f"dpbench.plan: error: {error}", file=sys.stderr)
        return 2
    finally:
        GlobalHydra.instance().clear()
    return 1 if failed else 2 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
