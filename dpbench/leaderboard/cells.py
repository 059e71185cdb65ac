"""One leaderboard cell: an ordinary `python -m dpbench` run in its own directory, run at most once.

A cell's directory holds cell.json (what it is: task, method, phase, epsilon, seed, hyperparameters, the command, and
the dpbench commit it ran at with whether the tree was dirty: provenance.py)
and then exactly one outcome: results.json (dpbench's own), refused.json (dpbench exited 2: the configuration
cannot run, e.g. a budget the method cannot reach; kept so it is shown and not re-run) or failed.json (a crash;
re-run on the next invocation). A recorded outcome counts only for the overrides it was run with: a cell
whose suite entry was edited runs again.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dpbench.core.results import RESULTS_FILE, read_results, write_json_atomic
from dpbench.leaderboard.launch import DEFAULT_LAUNCHER, RUNNING, make_launcher
from dpbench.leaderboard.provenance import at_launch

CELL_FILE = "cell.json"
REFUSED_FILE = "refused.json"
FAILED_FILE = "failed.json"
LOG_FILE = "cell.log"
ERROR_PREFIX = "dpbench: error: "
HYDRA_HINT = "Set the environment variable HYDRA_FULL_ERROR"


@dataclass
class Cell:
    task: str
    method: str
    variant: str
    label: str
    phase: str
    """tune (a trial on the validation split) or test (a seed of the chosen setting, evaluated on the test split)."""
    epsilon: float | None
    seed: int
    trial: int | None
    lr: float
    clip_norm: float | None
    overrides: list[str] = field(default_factory=list)
    """Everything passed to `python -m dpbench` except hydra.run.dir."""

    def directory(self, root: Path) -> Path:
        budget = "nonprivate" if self.epsilon is None else f"eps{self.epsilon:g}"
        leaf = f"tune_{budget}_t{self.trial}" if self.phase == "tune" else f"{budget}_s{self.seed}"
        return Path(root) / self.task / self.variant / leaf


def status(directory: Path) -> str:
    """done, refused, failed or pending (a run stopped by a failed per-sample check leaves a results.json that says
    so, and its refusal beside it)."""
    if (directory / REFUSED_FILE).exists():
        return "refused"
    if (directory / FAILED_FILE).exists():
        return "failed"
    if (directory / RESULTS_FILE).exists():
        return "done"
    return "pending"


STOPPED_REASON = "stopped with the suite before it finished (it runs again on the next invocation)"
"""A cell the suite's stop ended: its log's last line (a progress message) would read as the cause."""


def _reason(output: str) -> str:
    """dpbench's one-line refusal (the CLI prints `dpbench: error: ...`), else the last line it printed."""
    for line in reversed(output.splitlines()):
        if line.startswith(ERROR_PREFIX):
            return line[len(ERROR_PREFIX):].strip()
    lines = [line for line in output.splitlines() if line.strip() and not line.startswith(HYDRA_HINT)]
    return lines[-1].strip() if lines else "no message"


def _recorded_overrides(directory: Path) -> list[str] | None:
    path = directory / CELL_FILE
    return json.loads(path.read_text()).get("overrides") if path.exists() else None


def recorded(cell: Cell, root: Path) -> str | None:
    """done or refused when the cell's outcome is recorded for exactly its overrides, else None (it would run)."""
    directory = cell.directory(root)
    current = status(directory)
    return current if current in ("done", "refused") and _recorded_overrides(directory) == cell.overrides else None


def run_cell(cell: Cell, root: Path, env: dict[str, str] | None = None, launcher: str = DEFAULT_LAUNCHER,
             parameters: dict[str, Any] | None = None) -> str:
    """Run the cell unless its outcome is recorded for exactly these overrides (an edited suite re-runs it);
    `parameters`: the submitit launcher's."""
    directory = cell.directory(root)
    current = recorded(cell, root)
    if current is not None:
        return current
    if directory.exists():  # an interrupted or failed attempt: start clean
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    args = [*cell.overrides, f"hydra.run.dir={directory}"]
    code = at_launch()
    launched = {**asdict(cell), "command": ["python", "-m", "dpbench", *args], "launcher": launcher,
                "commit": code.commit, "dirty": code.dirty}
    write_json_atomic(directory / CELL_FILE, launched)
    started = time.perf_counter()
    returncode = make_launcher(launcher, parameters)(args, directory / LOG_FILE, env)
    wall = time.perf_counter() - started
    record = {**launched, "returncode": returncode, "process_wall_s": wall}
    write_json_atomic(directory / CELL_FILE, record)
    if returncode == 0 and (directory / RESULTS_FILE).exists():
        return "done"
    reason = STOPPED_REASON if RUNNING.stopped else _reason((directory / LOG_FILE).read_text())
    outcome = {"returncode": returncode, "reason": reason}
    if returncode == 2 and not RUNNING.stopped:
        write_json_atomic(directory / REFUSED_FILE, outcome)
        return "refused"
    write_json_atomic(directory / FAILED_FILE, outcome)
    return "failed"


def record_refusal(cell: Cell, root: Path, reason: str) -> str:
    """Record a cell the suite itself refuses without running it (a total budget no noise reaches), as dpbench's
    own refusal would be: shown in the report, not run again for the same overrides."""
    directory = cell.directory(root)
    if recorded(cell, root) == "refused":
        return "refused"
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    code = at_launch()
    write_json_atomic(directory / CELL_FILE, {**asdict(cell), "command": None, "launcher": None,
                                              "commit": code.commit, "dirty": code.dirty})
    write_json_atomic(directory / REFUSED_FILE, {"returncode": 2, "reason": reason})
    return "refused"


@dataclass
class Outcome:
    """What the report reads back from one cell directory."""

    cell: dict[str, Any]
    status: str
    results: dict[str, Any] | None
    """The run's results.json (core.results), as JSON."""
    reason: str | None
    path: Path

    @property
    def metric(self) -> str | None:
        return self.results.get("test_metric") if self.results else None

    def value(self, split: str) -> float | None:
        """The run's test or validation metric, straight from its results.json."""
        if not self.results:
            return None
        value = self.results.get(f"{split}_{self.results['test_metric']}")
        return None if value is None or not math.isfinite(float(value)) else float(value)


def read_outcome(directory: Path) -> Outcome | None:
    if not (directory / CELL_FILE).exists():
        return None
    cell = json.loads((directory / CELL_FILE).read_text())
    state = status(directory)
    results = read_results(directory).to_json() if state == "done" else None
    reason = None
    if state in ("refused", "failed"):
        reason = json.loads((directory / (REFUSED_FILE if state == "refused" else FAILED_FILE)).read_text())["reason"]
    return Outcome(cell, state, results, reason, directory)


def read_outcomes(root: Path) -> list[Outcome]:
    """Every cell under root, in a stable order."""
    found = [read_outcome(path.parent) for path in sorted(Path(root).rglob(CELL_FILE))]
    return [outcome for outcome in found if outcome is not None]
