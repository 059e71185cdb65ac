"""`python -m dpbench.leaderboard --private-tuning`: each private variant tuned by Papernot-Steinke private selection.

Per variant and tuning budget: K trials, K drawn from the chosen law with the suite's secret tuning randomness; trial k
runs the k-th point of the method's grid (a data-independent order, cycled); each finished trial's validation
accuracy is released with Gaussian noise from the same secret root; only the trial with the best noisy score is
kept, and its hyperparameters train every seed. The whole release (selection, then the final run) is accounted
with dp-accounting (dpbench.privacy.tuning) and written beside the cells as selection_eps<E>.json, which the report
reads ("epsilon 3.00 per run, 4.6 with tuning"). The secret lives in the suite root like a checkpoint's: a resumed
suite draws the same K, never a fresh one after seeing scores. The cells themselves (every trial, K) are the
operator's working files, not a release: the report shows only the winner.
"""

from __future__ import annotations

import json
import os
import secrets
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

from dpbench.core.errors import ConfigurationError
from dpbench.core.results import write_json_atomic
from dpbench.leaderboard.cells import Cell, read_outcome
from dpbench.leaderboard.grid import trial_points
from dpbench.leaderboard.private_tuning import PrivateTuning, run_privacy
from dpbench.leaderboard.suite import Suite, Task, Variant
from dpbench.privacy.randomness import PrivacyRandomness
from dpbench.privacy.tuning import tuning_epsilon
from dpbench.privacy.tuning_draws import draw_trial_count, noisy_score

SECRET_FILE = ".tuning_secret"
NO_SELECTION = "nothing selected"


def selection_path(root: Path, task: str, variant: str, epsilon: float) -> Path:
    return Path(root) / task / variant / f"selection_eps{epsilon:g}.json"


def suite_randomness(root: Path) -> PrivacyRandomness:
    """The suite's secret root: created once (owner-only), then reused by every invocation on this root."""
    path = Path(root) / SECRET_FILE
    if not path.exists():
        Path(root).mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(str(secrets.randbits(128)))
    return PrivacyRandomness(int(path.read_text()))


@dataclass(frozen=True)
class Selection:
    """What the report may show of one private tuning: the winner and the release's epsilons (never K)."""

    lr: float | None
    clip_norm: float | None
    law: str
    mean_trials: float
    score_noise_multiplier: float
    per_run: float | None
    with_tuning: float | None
    """The selection composed with every evaluation seed's final run."""
    tuning_alone: float | None
    delta: float
    reason: str | None = None
    """Why nothing was selected or accounted (no finished trial, K = 0, a loss metric...)."""
    finals: int = 1
    """Final runs (one per evaluation seed) composed into `with_tuning`."""


def _count_key(task: Task, epsilon: float) -> int:
    """The index of a task's number of trials at one budget, shared by its methods."""
    return zlib.crc32(f"{task.name}/{epsilon:g}".encode())


def _key(task: Task, variant: Variant, epsilon: float) -> int:
    """A stable index for this tuning's keys: the same task, rung and budget draw the same K on every invocation."""
    return zlib.crc32(f"{task.name}/{variant.name}/{epsilon:g}".encode())


class PrivateSelector:
    def __init__(self, suite: Suite, root: Path, tuning: PrivateTuning):
        self.suite, self.root, self.tuning = suite, Path(root), tuning
        self.randomness = suite_randomness(root)

    def trials(self, task: Task, epsilon: float) -> int:
        """K for every method and rung of a task at one budget: one secret draw, so that all get the same number."""
        return draw_trial_count(self.randomness, self.tuning.trials, _count_key(task, epsilon))

    def order(self, points: list[tuple[float, float | None]]) -> list[tuple[float, float | None]]:
        """The grid's points in the fixed, data-independent shuffled order every protocol uses (grid.trial_points):
        the first few trials spread over it."""
        return trial_points(points, len(points))

    def select(self, task: Task, variant: Variant, epsilon: float, cells: list[Cell], final: Cell) -> Selection:
        """The winner by noisy validation score among the trials run, and the release's epsilons (computed from the
        trial's and the final run's compositions, as their cells run them)."""
        law = self.tuning.trials
        common = {"law": law.name, "mean_trials": law.mean, "delta": task.delta,
                  "score_noise_multiplier": self.tuning.score_noise_multiplier, "finals": len(self.suite.seeds)}
        if not cells:
            return Selection(None, None, per_run=None, with_tuning=None, tuning_alone=None,
                             reason=f"{NO_SELECTION}: the draw gave no trial", **common)
        best, best_score = None, None
        for cell in cells:
            outcome = read_outcome(cell.directory(self.root))
            if outcome is None or outcome.results is None:
                continue
            if outcome.metric != "accuracy":
                return Selection(None, None, per_run=None, with_tuning=None, tuning_alone=None,
                                 reason=f"private tuning needs a bounded score: this task's metric is "
                                        f"{outcome.metric} (clip it to a range first)", **common)
            value = outcome.value("validation")
            score = noisy_score(self.randomness, 0.0 if value is None else value, int(outcome.results[
                "validation_size"]), self.tuning.score_noise_multiplier, cell.trial, _key(task, variant, epsilon))
            if best_score is None or score > best_score:
                best, best_score = cell, score
        if best is None:
            return Selection(None, None, per_run=None, with_tuning=None, tuning_alone=None,
                             reason=f"{NO_SELECTION}: no trial finished", **common)
        try:
            trial = run_privacy(best.overrides)
            final_run = run_privacy(final.overrides)
            accounted = tuning_epsilon(trial.composition, final_run.composition, law, task.delta,
                                       self.tuning.score_noise_multiplier, finals=len(self.suite.seeds))
        except ConfigurationError as error:
            return Selection(best.lr, best.clip_norm, per_run=None, with_tuning=None, tuning_alone=None,
                             reason=f"private tuning not accounted: {error}", **common)
        return Selection(best.lr, best.clip_norm, per_run=final_run.epsilon, with_tuning=accounted.with_tuning,
                         tuning_alone=accounted.tuning, **common)

    def record(self, task: Task, variant: Variant, epsilon: float, selection: Selection) -> None:
        write_json_atomic(selection_path(self.root, task.name, variant.name, epsilon), asdict(selection))


def read_selection(root: Path, task: str, variant: str, epsilon: float | None) -> Selection | None:
    if epsilon is None:
        return None
    path = selection_path(root, task, variant, epsilon)
    return Selection(**json.loads(path.read_text())) if path.exists() else None
