"""Which cells the suite runs, in which order: tuning trials, the choice, then seeds at every budget.

Fairness: every method runs the same number of trials, the first K points of the same grid over (learning rate, clip
norm) in a fixed shuffled order (grid.trial_points), on a validation split carved from the training data, with the
profile's tuning seed (no evaluation seed), at each budget (or once at tune_epsilon where the profile says so). A
per-run smoke profile may instead grow its grid past an edge (max_growth > 1): not a headline protocol, since the
methods' trial counts then differ. The best point by validation metric (ties: the smaller learning rate, then the
smaller clip norm; grid.TIE_RULE) is the one every evaluation seed of that budget trains with. Under a total budget
(total_budget.py) every private cell's noise is calibrated so that the trials, their noisy scores and the final runs
together spend the budget, and the choice is made on the released noisy scores.
"""

from __future__ import annotations

import logging
import threading
import zlib
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from dpbench.core.errors import ConfigurationError
from dpbench.leaderboard.cells import Cell, read_outcome, record_refusal, recorded, run_cell
from dpbench.leaderboard.grid import best_trial, trial_points
from dpbench.leaderboard.launch import DEFAULT_LAUNCHER, RUNNING, Stopped
from dpbench.leaderboard.private_selection import PrivateSelector, suite_randomness
from dpbench.leaderboard.private_tuning import PrivateTuning
from dpbench.leaderboard.suite import Method, Suite, Task, Variant
from dpbench.leaderboard.total_budget import TotalBudget, budget_path, calibrate_budget, read_budget, write_budget
from dpbench.leaderboard.trial_cells import cell_for, start_grid, trial_cell
from dpbench.privacy.tuning_draws import noisy_score

log = logging.getLogger(__name__)


def choose(cells: list[Cell], root: Path) -> Cell | None:
    """The trial with the best validation metric (ties: grid.TIE_RULE), or None when no trial finished."""
    by_point, trials, maximize = {}, [], True
    for cell in cells:
        outcome = read_outcome(cell.directory(root))
        value = outcome.value("validation") if outcome else None
        if value is not None:
            maximize = outcome.metric != "loss"
        by_point[(cell.lr, cell.clip_norm)] = cell
        trials.append((cell.lr, cell.clip_norm, value))
    best = best_trial(trials, maximize)
    return None if best is None else by_point[best[:2]]


REFUSED, UNFINISHED = "refused", "unfinished"
"""What tuning a variant gave instead of a chosen trial."""
FIXED_COUNT_SCORES = 2
"""First index of the secret `tuning` stream's keys for a total budget's noisy scores (tuning_draws uses 0 and 1)."""


def _score_key(task: Task, variant: Variant, epsilon: float) -> int:
    """A stable index for one variant's scores at one budget: a resumed suite releases the same noisy scores."""
    return zlib.crc32(f"{task.name}/{variant.name}/{epsilon:g}".encode())


class Scheduler:
    """Runs (or, with dry_run, lists) the cells of a suite; every cell already recorded is skipped."""

    def __init__(self, suite: Suite, root: Path, env: dict[str, str] | None = None, dry_run: bool = False,
                 launcher: str = DEFAULT_LAUNCHER, parameters: dict[str, Any] | None = None, jobs: int = 1,
                 private_tuning: PrivateTuning | None = None):
        """jobs: how many (task, method) pipelines run at once; 1 keeps every cell's cost figures undisturbed.
        private_tuning: tune private methods by private selection (private_selection.py) instead of the grid."""
        if jobs < 1:
            raise ConfigurationError(f"--jobs must be at least 1, got {jobs}")
        self.suite, self.root, self.env, self.dry_run = suite, Path(root), env, dry_run
        self.launcher, self.parameters, self.jobs = launcher, parameters, jobs
        self.selector = PrivateSelector(suite, root, private_tuning) if private_tuning else None
        self.total = suite.total and self.selector is None
        """Calibrate each private cell's noise to the budget as a total (private tuning accounts its own)."""
        self.budgets: dict[tuple[str, str, float, int], TotalBudget] = {}
        self.calibrating = threading.Lock()
        """Calibrations plan runs through Hydra's process-wide state: one at a time, whatever --jobs is."""
        self.planned: list[Cell] = []

    def _run(self, cell: Cell) -> str:
        if RUNNING.stopped:
            raise Stopped(cell.directory(self.root))  # ends this worker's pipeline before its next cell starts
        self.planned.append(cell)
        if self.dry_run:  # what is recorded, else what a run would most likely give
            return recorded(cell, self.root) or "done"
        earlier = recorded(cell, self.root)
        if earlier is not None:  # recorded by an earlier invocation: not news, and no new timestamp
            return earlier
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

    def _select_privately(self, task: Task, method: Method, variant: Variant, epsilon: float) -> Cell | str:
        """K secret trials over the grid's points, the best noisy score kept; its selection record written."""
        count = self.selector.trials(task, epsilon)
        points = self.selector.order(start_grid(self.suite, task, method).points())
        cells = []
        for k in range(count):
            lr, clip = points[k % len(points)]
            cells.append(trial_cell(self.suite, task, method, variant, epsilon, k, lr, clip))
            if self._run(cells[-1]) == "refused" and k == 0:
                return REFUSED
        if self.dry_run:
            return cells[0] if cells else UNFINISHED
        final = cell_for(self.suite, task, method, variant, "test", epsilon, self.suite.seeds[0], None, *points[0])
        selection = self.selector.select(task, variant, epsilon, cells, final)
        self.selector.record(task, variant, epsilon, selection)
        if selection.lr is None:
            log.warning("%s %s at epsilon %g: %s", task.name, variant.name, epsilon, selection.reason)
            return UNFINISHED
        return next(c for c in cells if (c.lr, c.clip_norm) == (selection.lr, selection.clip_norm))

    def _tune(self, task: Task, method: Method, variant: Variant, epsilon: float | None) -> Cell | str:
        """The variant's search at `epsilon` and its best trial, else REFUSED (it cannot run at that budget) or
        UNFINISHED (no trial finished with a finite metric). The grid grows while its best point is on an edge."""
        if self.selector is not None and epsilon is not None:
            return self._select_privately(task, method, variant, epsilon)
        if not self.suite.tuning.grows:
            return self._fixed_trials(task, method, variant, epsilon)
        grid = start_grid(self.suite, task, method)
        cells: dict[tuple[float, float | None], Cell] = {}
        while True:
            for lr, clip in grid.points():
                if (lr, clip) in cells:
                    continue
                cell = trial_cell(self.suite, task, method, variant, epsilon, len(cells), lr, clip)
                cells[(lr, clip)] = cell
                if self._run(cell) == "refused" and cell.trial == 0:
                    return REFUSED
            if self.dry_run:
                ran = [cell for cell in cells.values() if recorded(cell, self.root)]
                if len(ran) < len(cells):  # the best guess until every trial has run
                    return choose(ran, self.root) or next(iter(cells.values()))
            best = choose(list(cells.values()), self.root)
            if best is None:
                return UNFINISHED
            if not grid.extend((best.lr, best.clip_norm)):
                if grid.limited:
                    log.info("%s %s: the best trial lies on the grid's edge (%s)", task.name, variant.name,
                             ", ".join(grid.limited))
                return best

    def _fixed_trials(self, task: Task, method: Method, variant: Variant, epsilon: float | None) -> Cell | str:
        """The profile's K trials, the same points for every method; under a total budget at the calibrated noise,
        chosen on their released noisy scores."""
        budget = self._budget(task, method, variant, epsilon, self.suite.trials)
        points = trial_points(start_grid(self.suite, task, method).points(), self.suite.trials)
        sigma = None if budget is None else budget.noise_multiplier
        cells = [trial_cell(self.suite, task, method, variant, epsilon, k, lr, clip, sigma)
                 for k, (lr, clip) in enumerate(points)]
        if budget is not None and budget.reason is not None:
            self._refuse(cells[0], budget.reason)
            return REFUSED
        for cell in cells:
            if self._run(cell) == "refused" and cell.trial == 0:
                return REFUSED
        if self.dry_run:
            ran = [cell for cell in cells if recorded(cell, self.root)]
            return choose(ran, self.root) or cells[0]
        if budget is None or not budget.scored:
            return choose(cells, self.root) or UNFINISHED
        return self._choose_noisily(task, variant, epsilon, cells, budget)

    def _choose_noisily(self, task: Task, variant: Variant, epsilon: float, cells: list[Cell],
                        budget: TotalBudget) -> Cell | str:
        """The trial with the best released score, recorded with the calibration for the report: its validation
        accuracy (the largest wins), or a loss task's validation loss capped at B per example (the smallest wins),
        plus the accounted Gaussian noise of std z/n or z B/n; a finished trial without that score scores the worst
        (0, or B)."""
        randomness = suite_randomness(self.root)
        bound = budget.score_bound
        released, by_point = [], {}
        for cell in cells:
            outcome = read_outcome(cell.directory(self.root))
            if outcome is None or outcome.results is None:
                continue
            exact = outcome.value("validation") if bound is None else outcome.results.get("validation_capped_loss")
            worst = 0.0 if bound is None else bound
            score = noisy_score(randomness, worst if exact is None else exact,
                                int(outcome.results["validation_size"]), budget.score_noise_multiplier, cell.trial,
                                FIXED_COUNT_SCORES, _score_key(task, variant, epsilon),
                                score_range=1.0 if bound is None else bound)
            released.append([cell.trial, cell.lr, cell.clip_norm, score])
            by_point[(cell.lr, cell.clip_norm)] = cell
        write_budget(budget_path(self.root, task.name, variant.name, epsilon), budget.with_scores(released))
        best = best_trial([(lr, clip, score) for _, lr, clip, score in released], maximize=bound is None)
        return UNFINISHED if best is None else by_point[best[:2]]

    def _budget(self, task: Task, method: Method, variant: Variant, epsilon: float | None,
                trials: int) -> TotalBudget | None:
        """The variant's calibration to the total budget `epsilon` over `trials` trials and one final run per
        seed (None: budgets are per run here, or the method is not private); a recorded one is reused when it
        was calibrated for the same runs."""
        if not self.total or epsilon is None or not method.private or task.noise_multiplier is not None:
            return None
        key = (task.name, variant.name, epsilon, trials)
        with self.calibrating:
            return self._budget_locked(key, task, method, variant, epsilon, trials)

    def _budget_locked(self, key: tuple[str, str, float, int], task: Task, method: Method, variant: Variant,
                       epsilon: float, trials: int) -> TotalBudget:
        if key not in self.budgets:
            lr, clip = start_grid(self.suite, task, method).points()[0]  # neither changes sigma, q or the steps
            trial = trial_cell(self.suite, task, method, variant, epsilon, 0, lr, clip, 1.0)
            final = cell_for(self.suite, task, method, variant, "test", epsilon, self.suite.seeds[0], None, lr, clip,
                             1.0)
            problem = TotalBudget(epsilon, task.delta, trials, len(self.suite.seeds),
                                  self.suite.tuning.score_noise_at(epsilon),
                                  [trial.overrides, final.overrides])
            path = budget_path(self.root, task.name, variant.name, epsilon)
            earlier = read_budget(path)
            if earlier is not None and earlier.matches(problem):
                self.budgets[key] = earlier
            elif self.dry_run:  # a listing needs no sigma: every cell of an uncalibrated budget is still to run
                self.budgets[key] = problem
            else:
                self.budgets[key] = self._calibrate(problem)
                write_budget(path, self.budgets[key])
        return self.budgets[key]

    def _calibrate(self, problem: TotalBudget) -> TotalBudget:
        return calibrate_budget(problem)

    def _refuse(self, cell: Cell, reason: str) -> None:
        self.planned.append(cell)
        if not self.dry_run:
            record_refusal(cell, self.root, reason)

    def run_method(self, task: Task, method: Method) -> None:
        """Each variant shown is tuned with the same grid before its test runs (a ladder's rungs differ too much
        to share a choice: at few JL projections every trial trains to chance). A variant refused where it is tuned
        runs its test cells at the grid's first point, which records its refusal at each budget; one whose trials
        all failed runs no test cell."""
        tuned: dict[tuple[str, float | None], Cell | str] = {}
        untuned = start_grid(self.suite, task, method).points()[0]
        if task.cost_only or task.fixed:
            self._untuned(task, method)
            return
        for epsilon in (task.budgets or self.suite.budgets) if method.private else [None]:
            kept = 0
            for variant in method.variants():
                budget = self.suite.tuning_budget(epsilon)
                if (variant.name, budget) not in tuned:
                    tuned[(variant.name, budget)] = self._tune(task, method, variant, budget)
                chosen = tuned[(variant.name, budget)]
                if isinstance(chosen, Cell):
                    lr, clip = chosen.lr, chosen.clip_norm
                elif chosen == REFUSED:
                    lr, clip = untuned
                else:
                    continue
                if not self._seeds(task, method, variant, epsilon, lr, clip):
                    continue
                kept += 1
                if kept == method.keep:
                    break

    def _seeds(self, task: Task, method: Method, variant: Variant, epsilon: float | None, lr: float,
               clip: float | None, trials: int | None = None) -> bool:
        """Every seed's test cell at this point (under a total budget at the noise calibrated for `trials` trials,
        the profile's unless given); False (and no other seed run) when the first is refused."""
        budget = self._budget(task, method, variant, epsilon, self.suite.trials if trials is None else trials)
        sigma = None if budget is None else budget.noise_multiplier
        cells = [cell_for(self.suite, task, method, variant, "test", epsilon, seed, None, lr, clip, sigma)
                 for seed in self.suite.seeds]
        if budget is not None and budget.reason is not None:
            self._refuse(cells[0], budget.reason)
            return False
        if self._run(cells[0]) == "refused":
            return False
        for cell in cells[1:]:
            self._run(cell)
        return True

    def _untuned(self, task: Task, method: Method) -> None:
        """A cost-only task's seeds at the grid's centre and tune_epsilon (its costs, not its metric, are shown);
        a published recipe's at its own hyperparameters and each of the task's budgets."""
        if task.fixed:
            lr, clip = task.fixed[0], task.fixed[1] if method.private else None
            budgets = task.budgets or self.suite.budgets
        else:
            points = start_grid(self.suite, task, method).points()
            lr, clip = points[len(points) // 2]
            budgets = (self.suite.tune_epsilon,)
        for epsilon in budgets if method.private else [None]:
            for variant in method.variants():
                if self._seeds(task, method, variant, epsilon, lr, clip, trials=0):  # no tuning to count
                    break
