"""The benchmark itself: every method on common tasks, tuned the same way, at the same privacy budgets.

`python -m dpbench.leaderboard [--quick]` runs the suite of conf/leaderboard/suite.yaml cell by cell (each an
ordinary dpbench run, skipped when its outcome is recorded) and writes docs/leaderboard.md from the cells.
"""

from dpbench.leaderboard.cell_order import Scheduler
from dpbench.leaderboard.report import build
from dpbench.leaderboard.suite import Suite, load_suite

__all__ = ["Scheduler", "Suite", "build", "load_suite"]
