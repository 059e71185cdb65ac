"""Cell outcomes -> per (task, variant, epsilon) entries: mean and 95% interval over seeds, costs, refusals, the
seeds that diverged, and the selection score each entry was chosen by."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import mean, median, stdev

from dpbench.leaderboard.cells import Outcome
from dpbench.leaderboard.suite import chosen_in
from dpbench.report.stats import interval95


def _finite(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def seconds_per_step(results: dict) -> float | None:
    """The profiler's mean step after its warm-up steps: the window samples/s is measured in, so the two columns
    agree. Wall time over steps did not: on the MiniLM head (40 steps of 2 ms) the trainer's fixed costs made the
    non-private step look 1.8 times slower than DP-SGD's while its samples/s was 1.5 times higher."""
    return _finite(results.get("step_time_s"))


ABOVE_CHANCE = 0.01
"""How far above a constant prediction's accuracy a run must end to have learned something (one point)."""

DIVERGENCE_RULE = (f"a seed diverged when its run ended with a non-finite test loss or metric, or (where the task "
                   f"names its chance level) with a test accuracy at most {100 * ABOVE_CHANCE:g} point above chance "
                   "(or below it)")


@dataclass
class Entry:
    """The test-phase seeds of one variant at one budget (epsilon None: a non-private method)."""

    task: str
    method: str
    variant: str
    label: str
    epsilon: float | None
    metric: str | None = None
    by_seed: dict[int, float] = field(default_factory=dict)
    """Each seed's test value: comparisons pair methods seed by seed."""
    spent: list[float] = field(default_factory=list)
    samples_per_s: list[float] = field(default_factory=list)
    peak_mb: list[float] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    lr: float | None = None
    clip_norm: float | None = None
    device: str | None = None
    """Where the seeds ran (cpu, or the GPU's name): a verdict holds at the scale and on the device measured."""
    refused: str | None = None
    failed: list[str] = field(default_factory=list)
    pending: int = 0
    privatizer: str | None = None
    """The privatizer its cells chose: a paper's own setting runs a method under another name (D2P2 at the paper's
    projection), and its claim is still D2P2's."""
    optimizer: str | None = None
    """The optimizer its cells ran (sgd, adam): a paper's claim is judged against the vanilla method with its method's
    optimizer (compare.paper_baseline)."""
    non_finite: set[int] = field(default_factory=set)
    """Seeds whose run finished with a NaN or infinite test loss or metric (diverged, whatever their accuracy)."""
    on_edge: bool = False
    """Its search's best trial lies on the grid's edge at the search's limit: a better point may lie outside the
    range, so a comparison with it is read with that caveat (the claims name it)."""
    selection: float | None = None
    """The validation value of the tuning trial this entry's point was chosen by: the best method is picked on it,
    apart from the evaluation seeds (None where no search chose the point: a fixed recipe, a private tuning)."""

    @property
    def family(self) -> str:
        """The method a paper's claim is about: its privatizer where known, else the suite's method name."""
        return self.privatizer or self.method

    @property
    def values(self) -> list[float]:
        return list(self.by_seed.values())

    @property
    def mean(self) -> float | None:
        return mean(self.values) if self.values else None

    @property
    def std(self) -> float | None:
        return stdev(self.values) if len(self.values) > 1 else None

    @property
    def interval(self) -> tuple[float, float] | None:
        """Student-t 95% interval of the mean over seeds (None under two seeds), within an accuracy's 0-1: over few
        seeds with one diverged, the t interval reaches past both ends."""
        return interval95(self.values, (0.0, 1.0) if self.metric == "accuracy" else (None, None))

    def diverged(self, chance: float | None) -> list[int]:
        """The seeds that diverged (DIVERGENCE_RULE). Those with a finite value stay in the mean and the paired
        comparisons, as what the method gave at that seed; a seed without one has nothing to average."""
        at_chance = {seed for seed, value in self.by_seed.items()
                     if chance is not None and self.metric == "accuracy" and value <= chance + ABOVE_CHANCE}
        return sorted(self.non_finite | at_chance)

    @property
    def finished(self) -> int:
        """Seeds whose run finished, with a finite value or not."""
        return len(set(self.by_seed) | self.non_finite)

    def cost(self, name: str) -> float | None:
        """The median over seeds: two cells share this machine at a time, and one seed's run beside a heavier cell
        (2026-11-27: a CNN DP-Adam seed at 0.183 s a step against 0.059 and 0.079) should not move the figure."""
        values = getattr(self, name)
        return median(values) if values else None


@dataclass
class Tuning:
    """The tuning trials of one variant at one budget: (lr, clip, validation value, the outcome) per trial."""

    variant: str
    label: str
    epsilon: float | None
    trials: list[tuple[float, float | None, float | None, str]] = field(default_factory=list)


def _add(entry: Entry, outcome: Outcome) -> None:
    if outcome.status == "refused":
        entry.refused = outcome.reason
        return
    if outcome.status == "failed":
        entry.failed.append(outcome.reason or "")
        return
    if outcome.status == "pending":
        entry.pending += 1
        return
    results = outcome.results or {}
    entry.metric = results["test_metric"]
    entry.device = results.get("device") or entry.device
    seed, value, loss = int(outcome.cell["seed"]), outcome.value("test"), results.get("test_loss")
    if value is not None:
        entry.by_seed[seed] = value
    if value is None or (loss is not None and _finite(loss) is None):
        entry.non_finite.add(seed)
    for target, key in (("spent", "epsilon"), ("samples_per_s", "samples_per_s"), ("peak_mb", "peak_memory_mb"),
                        ("wall_s", "train_time_s")):
        number = _finite(results.get(key))
        if number is not None:
            getattr(entry, target).append(number)
    step = seconds_per_step(results)
    if step is not None:
        entry.step_s.append(step)


def summarize(outcomes: list[Outcome]) -> tuple[dict[str, list[Entry]], dict[str, list[Tuning]]]:
    """Entries and tuning records per task, in the order the cells were first seen."""
    entries: dict[tuple, Entry] = {}
    tuning: dict[tuple, Tuning] = {}
    for outcome in outcomes:
        cell = outcome.cell
        if cell["phase"] == "tune":
            record = tuning.setdefault((cell["task"], cell["variant"], cell["epsilon"]),
                                       Tuning(cell["variant"], cell["label"], cell["epsilon"]))
            record.trials.append((cell["lr"], cell["clip_norm"], outcome.value("validation"), outcome.status))
            continue
        key = (cell["task"], cell["variant"], cell["epsilon"])
        entry = entries.setdefault(key, Entry(cell["task"], cell["method"], cell["variant"], cell["label"],
                                              cell["epsilon"], lr=cell["lr"], clip_norm=cell["clip_norm"],
                                              privatizer=chosen_in(cell.get("overrides", []), "privatizer"),
                                              optimizer=chosen_in(cell.get("overrides", []), "optimizer")))
        _add(entry, outcome)
    for outcome in outcomes:  # a rung refused at the tuning budget has no test cells there: show the refusal
        cell = outcome.cell
        key = (cell["task"], cell["variant"], cell["epsilon"])
        if cell["phase"] == "tune" and outcome.status == "refused" and key not in entries:
            entries[key] = Entry(cell["task"], cell["method"], cell["variant"], cell["label"], cell["epsilon"],
                                 lr=cell["lr"], clip_norm=cell["clip_norm"], refused=outcome.reason,
                                 privatizer=chosen_in(cell.get("overrides", []), "privatizer"),
                                 optimizer=chosen_in(cell.get("overrides", []), "optimizer"))
    by_task: dict[str, list[Entry]] = defaultdict(list)
    for entry in entries.values():
        by_task[entry.task].append(entry)
    tuning_by_task: dict[str, list[Tuning]] = defaultdict(list)
    for (task, _, _), record in tuning.items():
        tuning_by_task[task].append(record)
    return dict(by_task), dict(tuning_by_task)


def attach_selection(entries: dict[str, list[Entry]], tuning: dict[str, list[Tuning]],
                     tuning_budget: Callable[[float | None], float | None],
                     skip: Callable[[Entry], bool] = lambda entry: False) -> None:
    """Give each entry the validation value of the trial at its own point in the search that tuned it (at
    `tuning_budget(epsilon)`); entries `skip` names (privately tuned: their scores are not released) keep None."""
    for task, task_entries in entries.items():
        records = {(r.variant, r.epsilon): r for r in tuning.get(task, [])}
        for entry in task_entries:
            record = records.get((entry.variant, tuning_budget(entry.epsilon)))
            if record is None or skip(entry):
                continue
            values = [value for lr, clip, value, _ in record.trials
                      if (lr, clip) == (entry.lr, entry.clip_norm) and value is not None]
            entry.selection = values[0] if values else None
