"""Which code produced each cell, and whether the report may put cells of different code side by side.

Every cell records the dpbench commit it ran at and whether the working tree was dirty then (cell.json's `commit`
and `dirty`). The report refuses cells whose privacy-relevant code (PRIVACY_PATHS) may differ: two commits whose
`git diff` over those paths is not empty, a dirty tree (its edits are recorded nowhere), a cell recorded before
cells kept their commit, or a commit this checkout cannot compare. `--allow-mixed-commits` reports them together,
and the report says so.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from dpbench.core.errors import ConfigurationError

PRIVACY_PATHS = (
    "dpbench/privatizers/",
    "dpbench/privacy/",
    "dpbench/training/step.py",
    "dpbench/training/module.py",
    "dpbench/training/private_loop.py",
    "dpbench/training/datamodule.py",
    "dpbench/training/callbacks.py",
    "dpbench/training/checkpointing.py",
    "dpbench/training/checkpoint_io.py",
    "dpbench/training/resume.py",
    "dpbench/app/run.py",
    "dpbench/core/config.py",
    "dpbench/leaderboard/private_selection.py",
    "dpbench/leaderboard/private_tuning.py",
    "dpbench/leaderboard/total_budget.py",
    "dpbench/leaderboard/cell_order.py",
    "conf/config.yaml",
    "conf/privatizer/",
)
"""The code an epsilon, a clipped and noised gradient or a sampled batch depends on: the strategies with their
clipping, noise and projections and the per-sample engines (privatizers/); the accountant, calibration, sampling
and secret randomness (privacy/); the private step, the Lightning module around it, the plain-loop wrapper, the
Poisson loader, the ledger's budget stop and a resume's replay of steps, noise and randomness (training/); the
run's wiring of the privacy plan (app/run.py); the privacy defaults of the config schema and of conf/, and the
strategies' configs; and the leaderboard's private tuning and total budgets (their calibration, and the choice on
the released noisy scores), whose epsilons the report prints. Models, data sets,
profiling and reporting are left out: they change what a cell measures, not whether its privacy figures hold."""

ALLOW_FLAG = "--allow-mixed-commits"
UNKNOWN = "unknown commit"


@dataclass(frozen=True)
class Provenance:
    """The commit a cell ran at (None: unknown) and whether the tree had edits that the commit does not hold."""

    commit: str | None
    dirty: bool

    def label(self) -> str:
        """'4949b35a12', '4949b35a12 (dirty tree)' or 'unknown commit'."""
        if self.commit is None:
            return UNKNOWN
        return self.commit[:10] + (" (dirty tree)" if self.dirty else "")


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], capture_output=True, text=True, cwd=repo, check=False)


def checkout() -> Path:
    """The dpbench checkout this module belongs to: the code a cell launched from here runs."""
    return Path(__file__).resolve().parent


def current(repo: Path | None = None) -> Provenance:
    """HEAD and whether any file outside docs/ differs from it, untracked ones included (a new module is code
    too); docs/ holds the report's own output. Outside git: unknown, and dirty (nothing says the code is clean)."""
    repo = repo or checkout()
    try:
        head = _git(repo, "rev-parse", "HEAD")
    except OSError:
        return Provenance(None, True)
    if head.returncode != 0:
        return Provenance(None, True)
    return Provenance(head.stdout.strip(), _edited(repo, ":/", ":(exclude,top)docs"))


def _edited(repo: Path, *paths: str) -> bool:
    """Whether the tree differs from HEAD under `paths`, untracked files included (True when git cannot say)."""
    try:
        edits = _git(repo, "status", "--porcelain", "--untracked-files=normal", "--", *paths)
    except OSError:
        return True
    return edits.returncode != 0 or bool(edits.stdout.strip())


@cache
def first_launch() -> Provenance:
    """The code this process saw when it launched its first cell: the interpreter and the fork server keep the
    modules they imported then, so a cell launched after the tree changed may run some of that code."""
    return current()


def at_launch() -> Provenance:
    """What a cell launched now records: the tree's commit, dirty when it has edits or when it changed since this
    process launched its first cell (the code the cell runs is then not one commit's)."""
    now = current()
    return Provenance(now.commit, now.dirty or now != first_launch())


def of_cell(cell: dict[str, Any]) -> Provenance:
    """A recorded cell's provenance; a cell written before cells kept their commit has an unknown one."""
    commit = cell.get("commit")
    return Provenance(commit if isinstance(commit, str) and commit else None, bool(cell.get("dirty", commit is None)))


def same_privacy_code(first: str, second: str, repo: Path | None = None) -> bool:
    """Whether two commits hold the same PRIVACY_PATHS; False (fail closed) when git cannot compare them."""
    if first == second:
        return True
    try:
        diff = _git(repo or checkout(), "diff", "--quiet", first, second, "--", *PRIVACY_PATHS)
    except OSError:
        return False
    return diff.returncode == 0


@dataclass(frozen=True)
class CommitCheck:
    """The cells' commits with their counts, whether privacy-relevant code may differ among them, and whether the
    checkout writing the report holds the same privacy-relevant code (None: nothing to compare)."""

    counts: dict[Provenance, int]
    mixed: bool
    checkout: Provenance | None = None
    checkout_same: bool | None = None

    def listing(self) -> str:
        """'4949b35a12 (120 cells), unknown commit (3 cells)'."""
        return ", ".join(f"{p.label()} ({n} cell{'s' if n != 1 else ''})" for p, n in self.counts.items())

    def _checkout_text(self) -> str:
        if self.checkout is None:
            return ""
        head = self.checkout.label()
        if self.checkout_same:
            return f"; the checkout writing this report ({head}) holds the same privacy-relevant code"
        return (f"; **the checkout writing this report ({head}) differs from them in privacy-relevant code (or "
                "cannot compare): these cells do not measure its privacy code**")

    def refusal(self, root: Path) -> str:
        return (f"cells under {root} ran at commits whose privacy-relevant code may differ: {self.listing()}; re-run "
                f"them at one clean commit (a fresh --root) or pass {ALLOW_FLAG} to report them together")

    def report_line(self) -> str:
        """The report's provenance line: the one code every cell ran, or the mix that was allowed."""
        if not self.counts:
            return "- Provenance: no cell has run yet."
        if not self.mixed:
            same = "" if len(self.counts) == 1 else (", commits that do not differ in privacy-relevant code "
                                                     "(dpbench/leaderboard/provenance.py, PRIVACY_PATHS)")
            return f"- Provenance: every cell ran on a clean tree at {self.listing()}{same}{self._checkout_text()}."
        return (f"- **Mixed commits, allowed by `{ALLOW_FLAG}`**: cells ran at {self.listing()}; privacy-relevant "
                "code may differ among them (a dirty tree or an unknown commit counts as differing), so cells of one "
                "table may not share the same privacy code.")


def check_commits(cells: list[dict[str, Any]], repo: Path | None = None) -> CommitCheck:
    """Group the cells by provenance and decide whether their privacy-relevant code may differ: it may unless every
    cell ran at a known commit on a clean tree and those commits hold the same PRIVACY_PATHS. Where they hold one
    code, compare it with the checkout's: a report written by later privacy code does not measure that code."""
    counts = Counter(of_cell(cell) for cell in cells)
    ordered = dict(sorted(counts.items(), key=lambda item: -item[1]))
    clean = [p.commit for p in ordered if p.commit is not None and not p.dirty]
    uncertain = len(clean) < len(ordered)
    mixed = uncertain or any(not same_privacy_code(clean[0], other, repo) for other in clean[1:])
    if mixed or not clean:
        return CommitCheck(ordered, mixed)
    here = current(repo)
    same = here.commit is not None and same_privacy_code(clean[0], here.commit, repo) \
        and not _edited(repo or checkout(), *PRIVACY_PATHS)
    return CommitCheck(ordered, mixed, here, same)


def require_one_code(cells: list[dict[str, Any]], root: Path, allow_mixed: bool,
                     repo: Path | None = None) -> CommitCheck:
    """The check, raised as a one-line refusal when the code may differ and the mix was not allowed."""
    found = check_commits(cells, repo)
    if found.mixed and not allow_mixed:
        raise ConfigurationError(found.refusal(root))
    return found
