"""A task run at its paper's own noise multiplier (Task.noise_multiplier, a like-for-like anchor) spends what that
noise spends, not the budget it is listed under: its cells, glance row and figures say so and place its runs at
their own epsilon, never on the axis of total budgets."""

from __future__ import annotations

import statistics
from dataclasses import replace

from dpbench.leaderboard.suite import Task
from dpbench.leaderboard.summary import Entry


def per_run(entry: Entry) -> float | None:
    """The epsilon one of the entry's runs spent (the median over its seeds: they spend alike), None before one ran."""
    return statistics.median(entry.spent) if entry.spent else None


def column(task: Task, epsilon: float) -> str:
    """A budget column's heading: 'epsilon 3', or the paper's noise where the task runs at it."""
    return f"epsilon {epsilon:g}" if task.noise_multiplier is None else f"the paper's noise {task.noise_multiplier:g}"


def glance_budget(task: Task, entry: Entry) -> str:
    """The glance table's budget: '3', or 'the paper's noise 2.15 (2.39 a run)'."""
    if task.noise_multiplier is None or entry.epsilon is None:
        return "-" if entry.epsilon is None else f"{entry.epsilon:g}"
    spent = per_run(entry)
    return f"the paper's noise {task.noise_multiplier:g}" + ("" if spent is None else f" ({spent:.2f} a run)")


def cell_note(task: Task, entry: Entry) -> str:
    """'; epsilon 2.39 per run, its 5 runs not composed into a total' for a private cell at the paper's noise."""
    spent = per_run(entry)
    if task.noise_multiplier is None or entry.epsilon is None or spent is None:
        return ""
    return (f"; at the paper's noise {task.noise_multiplier:g}: epsilon {spent:.2f} per run, its {entry.finished} "
            "runs not composed into a total")


def placed(task: Task, entries: list[Entry]) -> list[Entry]:
    """The entries as a figure draws them: at the paper's noise, each private one at its per-run epsilon."""
    if task.noise_multiplier is None:
        return entries
    return [entry if entry.epsilon is None or per_run(entry) is None else replace(entry, epsilon=per_run(entry))
            for entry in entries]
