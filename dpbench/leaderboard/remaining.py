"""What a suite has left to run and about how long that takes (--dry-run), from the cells it has recorded.

Each cell still to run is estimated by the median wall time of the finished cells' processes (with a cluster
launcher, their queue wait too) of its task and method, else of its task: a method's trials and seeds train alike,
and tasks differ by orders of magnitude. A task with no finished cell is left unestimated rather than guessed.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from dpbench.leaderboard.cells import CELL_FILE, Cell, recorded


@dataclass
class Remaining:
    recorded_cells: int
    to_run: list[Cell]
    seconds: float
    """Estimated wall time of the cells to run that could be estimated, one after another."""
    unestimated: int

    def describe(self, jobs: int) -> str:
        """At --jobs J the time divides by J at best: fewer pipelines left than jobs divide it by less."""
        if not self.to_run:
            return f"all {self.recorded_cells} cells are recorded"
        if self.unestimated == len(self.to_run):
            return (f"{self.recorded_cells} cells recorded, {len(self.to_run)} to run at least (grids that grow add "
                    "more): no task has a finished cell yet, so there is no time to estimate from (a cell's time is "
                    "that of its task's finished cells); run the suite a while, then --dry-run again")
        hours = self.seconds / 3600
        text = (f"{self.recorded_cells} cells recorded, {len(self.to_run)} to run at least (grids that grow add "
                f"more): about {hours:.1f} h of cell processes, {hours / jobs:.1f} h at --jobs {jobs} at best, from "
                "the process times of each task's and method's finished cells")
        if self.unestimated:
            text += f"; {self.unestimated} cells of tasks with no finished cell are not in that estimate"
        return text


def _process_seconds(cell: Cell, root: Path) -> float | None:
    path = cell.directory(root) / CELL_FILE
    seconds = json.loads(path.read_text()).get("process_wall_s") if path.exists() else None
    return float(seconds) if seconds is not None else None


def remaining(cells: list[Cell], root: Path) -> Remaining:
    """Count the planned cells that are recorded and estimate the rest (refused cells stop early: not a sample)."""
    by_method: dict[tuple[str, str], list[float]] = {}
    by_task: dict[str, list[float]] = {}
    to_run = []
    for cell in cells:
        state = recorded(cell, root)
        if state is None:
            to_run.append(cell)
            continue
        seconds = _process_seconds(cell, root) if state == "done" else None
        if seconds is not None:
            by_method.setdefault((cell.task, cell.method), []).append(seconds)
            by_task.setdefault(cell.task, []).append(seconds)
    total, unestimated = 0.0, 0
    for cell in to_run:
        samples = by_method.get((cell.task, cell.method)) or by_task.get(cell.task)
        if samples:
            total += statistics.median(samples)
        else:
            unestimated += 1
    return Remaining(len(cells) - len(to_run), to_run, total, unestimated)
