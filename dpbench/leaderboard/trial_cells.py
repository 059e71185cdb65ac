"""A cell from its task, method, budget and hyperparameters, and the grid a method's tuning starts from: shared by
the scheduler, the private-tuning plan and the private selection."""

from __future__ import annotations

from dpbench.leaderboard.cells import Cell
from dpbench.leaderboard.grid import TuningGrid
from dpbench.leaderboard.suite import Method, Suite, Task, Variant


def start_grid(suite: Suite, task: Task, method: Method) -> TuningGrid:
    """The method's grid on the task's first range: the same points for every method with the same optimizer."""
    return TuningGrid.start(task.lr[task.optimizer_of(method)], task.clip if method.private else None, suite.tuning)


def cell_for(suite: Suite, task: Task, method: Method, variant: Variant, phase: str, epsilon: float | None,
             seed: int, trial: int | None, lr: float, clip_norm: float | None,
             noise_multiplier: float | None = None) -> Cell:
    """The cell's overrides; with `noise_multiplier` (a total budget's calibration) the run's noise is fixed there
    instead of calibrated to `epsilon` for the run alone."""
    optimizer = task.optimizer_of(method)
    overrides = [*task.overrides, *variant.overrides, *task.budget_overrides(method, epsilon), f"optimizer={optimizer}",
                 f"optimizer.lr={lr}", f"seed={seed}", *suite.common, f"logger.group=leaderboard-{task.name}"]
    noise_multiplier = task.noise_multiplier or noise_multiplier  # a published anchor's own noise is never calibrated
    if method.private:
        noise = ["privacy.epsilon=null", f"privacy.noise_multiplier={noise_multiplier!r}"] if noise_multiplier \
            else [f"privacy.epsilon={epsilon:g}", "privacy.noise_multiplier=null"]
        overrides += [*noise, f"privacy.delta={task.delta:g}", f"privacy.clip_norm={clip_norm}"]
    if phase == "tune":
        overrides.append(f"++data.validation_size={task.validation_size}")
    return Cell(task=task.name, method=method.name, variant=variant.name, label=variant.label, phase=phase,
                epsilon=epsilon if method.private else None, seed=seed, trial=trial, lr=lr, clip_norm=clip_norm,
                overrides=overrides)


def trial_cell(suite: Suite, task: Task, method: Method, variant: Variant, epsilon: float | None, trial: int,
               lr: float, clip_norm: float | None, noise_multiplier: float | None = None) -> Cell:
    """A tuning trial: a selection run on the profile's tuning seed, which no evaluation seed shares."""
    return cell_for(suite, task, method, variant, "tune", epsilon, suite.tuning_seed, trial, lr, clip_norm,
                    noise_multiplier)
