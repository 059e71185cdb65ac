"""Which cells the suite runs, in which order: tuning trials, the choice, then seeds at every budget.

Fairness: every method gets the same `trials` points over (learning rate, clip norm), the same quasi-random
(Halton) points of the task's log-scale ranges, on a validation split carved from the training data, at the
profile's tune_epsilon and seed 0. The best point by validation metric is reused at every budget and seed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from dpbench.errors import ConfigurationError
from dpbench.leaderboard.cells import Cell, read_outcome, run_cell
from dpbench.leaderboard.launch import DEFAULT_LAUNCHER, RUNNING, Stopped
from dpbench.leaderboard.suite import Method, Suite, Task, Variant

log = logging.getLogger(__name__)
TUNING_SEED = 0


def halton(index: int, base: int) -> float:
    """The index-th (from 1) element of the van der Corput sequence in `base`: evenly spread points in (0, 1)."""
    result, fraction = 0.0, 1.0
    while index > 0:
        fraction /= base
        result += fraction * (index % base)
        index //= base
    return result


def log_point(bounds: tuple[float, float], u: float) -> float:
    low, high = bounds
    return float(f"{low * (high / low) ** u:.3g}")


def trial_points(task: Task, method: Method, trials: int) -> list[tuple[float, float | None]]:
    """(lr, clip norm) of each trial: Halton bases 2 and 3 over the ranges; no clip norm for a non-private method."""
    lr_range = task.lr[task.optimizer_of(method)]
    return [(log_point(lr_range, halton(k, 2)), log_point(task.clip, halton(k, 3)) if method.private else None)
            for k in range(1, trials + 1)]


def cell_for(suite: Suite, task: Task, method: Method, variant: Variant, phase: str, epsilon: float | None,
             seed: int, trial: int | None, lr: float, clip_norm: float | None) -> Cell:
    optimizer = task.optimizer_of(method)
    overrides = [*task.overrides, *variant.overrides, f"optimizer={optimizer}", f"optimizer.lr={lr}", f"seed={seed}",
                 *suite.common, f"logger.group=leaderboard-{task.name}"]
    if method.private:
        overrides += [f"privacy.epsilon={epsilon:g}", "privacy.noise_multiplier=null", f"privacy.delta={task.delta:g}",
                      f"privacy.clip_norm={clip_norm}"]
    if phase == "tune":
        overrides.append(f"++data.validation_size={task.validation_size}")
    return Cell(task=task.name, method=method.name, variant=variant.name, label=variant.label, phase=phase,
                epsilon=epsilon if method.private else None, seed=seed, trial=trial, lr=lr, clip_norm=clip_norm,
                overrides=overrides)


def better(metric: str) -> Callable[[float, float], bool]:
    """Accuracy is maximised, a loss minimised."""
    return (lambda a, b: a < b) if metric == "loss" else (lambda a, b: a > b)


def choose(cells: list[Cell], root: Path) -> Cell | None:
    """The trial with the best validation metric (the first on ties), or None when no trial finished."""
    best, best_value = None, None
    for cell in cells:
        outcome = read_outcome(cell.directory(root))
        value = outcome.value("validation") if outcome else None
        if value is None:
            continue
        if best_value is None or better(outcome.metric)(value, best_value):
            best, best_value = cell, value
    return best


REFUSED, UNFINISHED = "refused", "unfinished"
"""What tuning a variant gave instead of a chosen trial."""


class Scheduler:
    """Runs (or, with dry_run, lists) the cells of a suite; every cell already recorded is skipped."""

    def __init__(self, suite: Suite, root: Path, env: dict[str, str] | None = None, dry_run: bool = False,
                 launcher: str = DEFAULT_LAUNCHER, parameters: dict[str, Any] | None = None, jobs: int = 1):
        """jobs: how many (task, method) pipelines run at once; 1 keeps every cell's cost figures undisturbed."""
        if jobs < 1:
            raise ConfigurationError(f"--jobs must be at least 1, got {jobs}")
        self.suite, self.root, self.env, self.dry_run = suite, Path(root), env, dry_run
        self.launcher, self.parameters, self.jobs = launcher, parameters, jobs
        self.planned: list[Cell] = []

    def _run(self, cell: Cell) -> str:
        if RUNNING.stopped:
            raise Stopped(cell.directory(self.root))  # ends this worker's pipeline before its next cell starts
        self.planned.append(cell)
        if self.dry_run:
            return "done"
        state = run_cell(cell, self.root, self.env, self.launcher, self.parameters)
        log.info("%-8s %s", state, cell.directory(self.root).relative_to(self.root))
        return state

    def run(self) -> None:
        RUNNING.reset()
        pipelines = []
        for task in self.suite.tasks:
            reason = task.skip_reason()
            if reason:
                log.warning("%s: %s", task.name, reason)
                continue
            pipelines += [(task, method) for method in task.methods]
        if self.jobs == 1 or self.dry_run:
            for task, method in pipelines:
                self.run_method(task, method)
            return
        with ThreadPoolExecutor(self.jobs, thread_name_prefix="leaderboard") as pool:
            futures = [pool.submit(self.run_method, task, method) for task, method in pipelines]
            try:
                wait(futures, return_when=FIRST_EXCEPTION)
                for future in futures:
                    future.result()
            except BaseException:  # stopped (or a pipeline failed): no new cell starts, the running ones stop
                RUNNING.stop_all()
                pool.shutdown(wait=False, cancel_futures=True)
                raise

    def _tune(self, task: Task, method: Method, variant: Variant) -> Cell | str:
        """The variant's trials at tune_epsilon and its best one, else REFUSED (it cannot run there) or UNFINISHED
        (no trial finished with a finite metric)."""
        epsilon = self.suite.tune_epsilon if method.private else None
        cells = [cell_for(self.suite, task, method, variant, "tune", epsilon, TUNING_SEED, k, lr, clip)
                 for k, (lr, clip) in enumerate(trial_points(task, method, self.suite.trials))]
        if self._run(cells[0]) == "refused":
            return REFUSED
        for cell in cells[1:]:
            self._run(cell)
        return cells[0] if self.dry_run else choose(cells, self.root) or UNFINISHED

    def run_method(self, task: Task, method: Method) -> None:
        """Each variant shown is tuned with the same trials before its test runs (a ladder's rungs differ too much
        to share a choice: at few JL projections every trial trains to chance). A variant refused at tune_epsilon
        runs its test cells at trial 0's point, which records its refusal at each budget (the tuning list shows it
        untuned should a larger budget reach it); one whose trials all failed runs no test cell."""
        tuned: dict[str, Cell | str] = {}
        untuned = trial_points(task, method, self.suite.trials)[0]
        for epsilon in self.suite.budgets if method.private else [None]:
            kept = 0
            for variant in method.variants():
                if variant.name not in tuned:
                    tuned[variant.name] = self._tune(task, method, variant)
                chosen = tuned[variant.name]
                if isinstance(chosen, Cell):
                    lr, clip = chosen.lr, chosen.clip_norm
                elif chosen == REFUSED:
                    lr, clip = untuned
                else:
                    continue
                cells = [cell_for(self.suite, task, method, variant, "test", epsilon, seed, None, lr, clip)
                         for seed in self.suite.seeds]
                if self._run(cells[0]) == "refused":
                    continue
                for cell in cells[1:]:
                    self._run(cell)
                kept += 1
                if kept == method.keep:
                    break
