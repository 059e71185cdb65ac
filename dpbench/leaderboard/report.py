"""docs/leaderboard.md, its per-cell CSV and figures, generated from the cells' own results.json files only."""

from __future__ import annotations

import csv
import json
import os
import platform
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from dpbench.core.tasks import NegativeSamplingTask
from dpbench.core.wording import counted
from dpbench.leaderboard.accountants import accountant_lines
from dpbench.leaderboard.cells import Outcome, read_outcomes
from dpbench.leaderboard.claims import (
    CLOSE_POINTS,
    check_claims,
    fmt_entry,
    fmt_number,
    fmt_ratio,
    fmt_value,
    learned,
    named,
    winners,
)
from dpbench.leaderboard.compare import best_baseline, best_of, chosen_on_selection
from dpbench.leaderboard.earlier_rounds import with_earlier_round
from dpbench.leaderboard.family import ALPHA, Family, Judge, better_test, judge_all
from dpbench.leaderboard.grid import STEP_BRACKETED, TIE_RULE, best_trial, optimum_status
from dpbench.leaderboard.paper_noise import cell_note, column, glance_budget, placed
from dpbench.leaderboard.plots import cost_plot, epsilon_plot, headline_plot
from dpbench.leaderboard.private_selection import Selection, read_selection
from dpbench.leaderboard.provenance import CommitCheck, require_one_code
from dpbench.leaderboard.recost import costs_section
from dpbench.leaderboard.scale import scale_section
from dpbench.leaderboard.suite import MIN_EVALUATION_SEEDS, Method, Suite, Task, Variant
from dpbench.leaderboard.summary import DIVERGENCE_RULE, Entry, Tuning, attach_selection, seconds_per_step, summarize
from dpbench.leaderboard.total_budget import TotalBudget, budget_path, read_budget
from dpbench.leaderboard.trial_cells import cell_for

RUNS_FILE = "suite_runs.json"
CSV_COLUMNS = ("task", "method", "variant", "label", "phase", "status", "reason", "target_epsilon", "epsilon_spent",
               "delta", "seed", "trial", "lr", "clip_norm", "metric", "test_value", "validation_value",
               "samples_per_s", "peak_memory_mb", "train_time_s", "steps", "s_per_step", "noise_multiplier",
               "process_wall_s", "commit", "dirty", "cell")


def record_invocation(root: Path, command: list[str], started: datetime, wall_s: float, stopped: bool = False) -> None:
    """Append one suite invocation (a resumed suite has several, stopped ones included) to root/suite_runs.json."""
    path = Path(root) / RUNS_FILE
    runs = json.loads(path.read_text()) if path.exists() else []
    runs.append({"started": started.isoformat(timespec="seconds"), "wall_s": round(wall_s, 1), "command": command,
                 "machine": machine(), "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
                 "stopped": stopped})
    temporary = path.with_suffix(".json.tmp")  # a second signal mid-write must not leave a broken record
    temporary.write_text(json.dumps(runs, indent=2))
    os.replace(temporary, path)


def machine() -> str:
    return (f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores, "
            f"torch {torch.__version__}, python {platform.python_version()}")


def _invocations(runs: list[dict]) -> str:
    def one(run: dict) -> str:
        load = run.get("load_average_at_end")
        return (f"{run['wall_s']:.0f} s ({run['started']}, `{' '.join(run['command'])}`"
                + (", stopped" if run.get("stopped") else "")
                + (f", load average 1/5/15 min at its end {load}" if load else "") + ")")

    total = f"{sum(run['wall_s'] for run in runs):.0f} s in all: " if len(runs) > 1 else ""
    return total + ", ".join(one(run) for run in runs)


def csv_rows(outcomes: list[Outcome], root: Path,
             released: dict[tuple[str, str, float, int], float] | None = None) -> list[dict]:
    """One row per cell; a trial under a total budget shows its released noisy score as its validation value, and no
    trial shows a test value: a table of every trial's test accuracy invites choosing on the test split."""
    rows = []
    for outcome in outcomes:
        cell, results = outcome.cell, outcome.results or {}
        validation = outcome.value("validation")
        key = (cell["task"], cell["variant"], cell["epsilon"], cell["trial"])
        if released is not None and cell["phase"] == "tune" and any(k[:3] == key[:3] for k in released):
            validation = released.get(key)
        rows.append({
            "task": cell["task"], "method": cell["method"], "variant": cell["variant"], "label": cell["label"],
            "phase": cell["phase"], "status": outcome.status, "reason": outcome.reason or "",
            "target_epsilon": cell["epsilon"], "epsilon_spent": results.get("epsilon"), "delta": results.get("delta"),
            "seed": cell["seed"], "trial": cell["trial"], "lr": cell["lr"], "clip_norm": cell["clip_norm"],
            "metric": outcome.metric, "test_value": None if cell["phase"] == "tune" else outcome.value("test"),
            "validation_value": validation, "samples_per_s": results.get("samples_per_s"),
            "peak_memory_mb": results.get("peak_memory_mb"), "train_time_s": results.get("train_time_s"),
            "steps": results.get("steps"), "s_per_step": seconds_per_step(results) if results else None,
            "noise_multiplier": results.get("noise_multiplier"), "process_wall_s": cell.get("process_wall_s"),
            "commit": cell.get("commit"), "dirty": cell.get("dirty"), "cell": str(outcome.path.relative_to(root)),
        })
    return rows


def _deltas(suite: Suite) -> str:
    """'delta 1e-05 for every task', or the suite's delta and the tasks that set their own."""
    own: dict[float, list[str]] = {}
    for task in suite.tasks:
        if task.delta != suite.delta:
            own.setdefault(task.delta, []).append(task.name)
    if not own:
        return f"delta {suite.delta:g} for every task"
    exceptions = "; ".join(f"{delta:g} for {', '.join(names)}" for delta, names in own.items())
    return f"delta {suite.delta:g} ({exceptions})"


def _order(task: Task, entries: list[Entry]) -> list[Entry]:
    rank = {}
    for i, method in enumerate(task.methods):
        for j, variant in enumerate(method.variants()):
            rank[variant.name] = (i, j)
    return sorted(entries, key=lambda e: (rank.get(e.variant, (99, 0)), e.epsilon or 0.0))


def _anchor_text(task: Task, entry: Entry) -> str:
    """' (published 86.0%: Tramer & Boneh ...)' where a published figure matches this cell, else ''."""
    found = [a for a in task.anchors if a.method == entry.method and a.epsilon == entry.epsilon]
    return "".join(f"; published {fmt_value(a.value, entry.metric)} ({a.source})" for a in found)


Selections = dict[tuple[str, str, float], Selection | TotalBudget]
"""Per (task, variant, tuning budget): a private tuning's record, or a total budget's calibration."""


def read_selections(root: Path, suite: Suite) -> Selections:
    """Every private tuning's released record and every total budget's calibration under root, by (task, variant,
    tuning budget)."""
    found: Selections = {}
    for task in suite.tasks:
        for method in task.methods:
            for variant in method.variants():
                for epsilon in suite.budgets:
                    key = (task.name, variant.name, epsilon)
                    record = read_selection(root, *key) or read_budget(budget_path(root, *key))
                    if record is not None:
                        found[key] = record
    return found


def _tuning_text(selection: Selection | TotalBudget | None) -> str:
    """'; epsilon 3.00 per run, 4.62 with tuning' for a privately tuned cell; '; total epsilon 3 (9 trials, 5
    final runs), 0.67 per run' for a cell calibrated to a total."""
    if isinstance(selection, TotalBudget):
        return _total_text(selection)
    if selection is None:
        return ""
    if selection.with_tuning is None:
        return f"; {selection.reason}"
    return (f"; epsilon {selection.per_run:.2f} per run, {selection.with_tuning:.2f} with tuning and "
            f"{counted(selection.finals, 'final run')}")


def _total_text(budget: TotalBudget) -> str:
    if budget.total is None:
        return ""
    runs = f"{counted(budget.trials, 'trial')}, {counted(budget.finals, 'final run')}"
    if not budget.scored:
        return (f"; epsilon {budget.per_run:.2f} per run, {budget.total:.2f} over {runs} without the selection on the "
                f"exact validation loss, which has no bound (not accounted)")
    return f"; total epsilon {budget.total:.2f} ({runs}), {budget.per_run:.2f} per run"


def released_scores(selections: Selections) -> dict[tuple[str, str, float, int], float]:
    """The noisy validation score each trial of a total budget released, by (task, variant, budget, trial): what
    the report may show of the trials in place of their exact validation values."""
    return {(task, variant, epsilon, int(trial)): score
            for (task, variant, epsilon), record in selections.items() if isinstance(record, TotalBudget)
            for trial, _, _, score in record.scores}


def release_only_noisy_scores(tuning: dict[str, list[Tuning]], selections: Selections) -> None:
    """Replace each trial's exact validation value by its released noisy score (None: none released) wherever a
    total budget accounted the scores: an exact value on the private validation split is no release of it."""
    for task, records in tuning.items():
        for record in records:
            budget = selections.get((task, record.variant, record.epsilon))
            if not isinstance(budget, TotalBudget) or not budget.scored:
                continue
            scores = {(lr, clip): score for _, lr, clip, score in budget.scores}
            record.trials = [(lr, clip, scores.get((lr, clip)), state) for lr, clip, _, state in record.trials]


def _cell_text(task: Task, entry: Entry | None, notes: list[str], selections: Selections, suite: Suite) -> str:
    """The table's text for one entry: mean [95% interval], its tuned point and its diverged seeds; a refusal's
    reason goes to the numbered notes under the table."""
    if entry is None:
        return "-"
    if entry.refused:
        at = "refused" if entry.epsilon is None else f"refused at epsilon {entry.epsilon:g}"  # non-private: no budget
        note = f"{at}: {entry.refused}"
        if note not in notes:
            notes.append(note)
        return f"{at} [{notes.index(note) + 1}]"
    if entry.mean is not None:
        text = fmt_entry(entry)
        point = f"lr {entry.lr:.3g}" + ("" if entry.clip_norm is None else f", clip {entry.clip_norm:.3g}")
        selection = selections.get((task.name, entry.variant, suite.tuning_budget(entry.epsilon)))
        text += (f" ({point}{_tuning_text(selection)}{cell_note(task, entry)}{_earlier_text(task, entry, selection)}"
                 f"{_anchor_text(task, entry)})" + _diverged_text(task, entry))
        if entry.failed or entry.pending:
            text += f" ({counted(len(entry.values), 'seed')}; {len(entry.failed)} failed, {entry.pending} pending)"
        return text
    if entry.failed:
        return f"failed: {entry.failed[0]}"
    if entry.non_finite:
        return f"diverged: {len(entry.non_finite)}/{entry.finished} seeds ended without a finite value"
    return "pending"


def _earlier_text(task: Task, entry: Entry, selection: Selection | TotalBudget | None) -> str:
    """'; at most 1.46 with the discarded first round (9 trials, up to 5 final runs)' where the profile records one
    before this cell (Task.earlier_rounds), else ''."""
    trials = task.earlier_trials(entry.variant, entry.epsilon)
    if not trials or not isinstance(selection, TotalBudget) or selection.total is None:
        return ""
    return (f"; **at most {with_earlier_round(selection, trials):.2f} with the discarded first round** "
            f"({counted(trials, 'trial')}, up to {counted(selection.finals, 'final run')})")


def _diverged_text(task: Task, entry: Entry) -> str:
    """' (2/5 diverged)' where any finished seed diverged (summary.DIVERGENCE_RULE), else ''."""
    diverged = entry.diverged(task.chance)
    return f" ({len(diverged)}/{entry.finished} diverged)" if diverged else ""


def _variants(task: Task, entries: list[Entry]) -> dict[str, list[Entry]]:
    variants: dict[str, list[Entry]] = {}
    for entry in _order(task, entries):
        variants.setdefault(entry.variant, []).append(entry)
    return variants


def _cost_reference(group: list[Entry], suite: Suite) -> tuple[Entry, str]:
    """The entry whose costs a row shows (the tune_epsilon one where it ran) and a note when it is another budget."""
    by_eps = {e.epsilon: e for e in group}
    reference = by_eps.get(suite.tune_epsilon) or next((e for e in group if e.mean is not None), group[0])
    if reference.mean is None:
        reference = next((e for e in group if e.mean is not None), reference)
    note = "" if reference.epsilon in (suite.tune_epsilon, None) else f" (at epsilon {reference.epsilon:g})"
    return reference, note


def _task_table(task: Task, entries: list[Entry], suite: Suite, selections: Selections) -> list[str]:
    budgets = task.budgets or suite.budgets
    columns = [column(task, b) for b in budgets]
    lines = ["| method | " + " | ".join(columns) + " | non-private | samples/s | peak MB | s/step | wall s |",
             "|---" * (len(columns) + 6) + "|"]
    notes: list[str] = []
    for group in _variants(task, entries).values():
        by_eps = {e.epsilon: e for e in group}
        reference, cost_note = _cost_reference(group, suite)
        cells = [_cell_text(task, by_eps.get(b), notes, selections, suite) if None not in by_eps else ""
                 for b in budgets]
        nonprivate = _cell_text(task, by_eps.get(None), notes, selections, suite) if None in by_eps else ""
        lines.append(
            f"| {group[0].label} | " + " | ".join(cells) + f" | {nonprivate} | "
            f"{fmt_number(reference.cost('samples_per_s'), '.0f')} | {fmt_number(reference.cost('peak_mb'), '.0f')} | "
            f"{fmt_number(reference.cost('step_s'), '.3f')} | "
            f"{fmt_number(reference.cost('wall_s'), '.1f')}{cost_note} |"
        )
    lines.append("")
    if notes:
        lines += [f"[{i}] {note}" + ("  " if i < len(notes) else "") for i, note in enumerate(notes, 1)] + [""]
    return lines


def _cost_table(task: Task, entries: list[Entry], suite: Suite) -> list[str]:
    """A cost-only task: each method's speed and memory, its metric not ranked."""
    lines = ["| method | samples/s | peak MB | s/step | wall s | epsilon of the costs |", "|---" * 6 + "|"]
    for group in _variants(task, entries).values():
        reference, _ = _cost_reference(group, suite)
        budget = "non-private" if reference.epsilon is None else f"{reference.epsilon:g}"
        lines.append(f"| {group[0].label} | {fmt_number(reference.cost('samples_per_s'), '.0f')} | "
                     f"{fmt_number(reference.cost('peak_mb'), '.0f')} | "
                     f"{fmt_number(reference.cost('step_s'), '.3f')} | "
                     f"{fmt_number(reference.cost('wall_s'), '.1f')} | {budget} |")
    return [*lines, ""]


def _tuning_lines(task: Task, tuning: list[Tuning], entries: list[Entry], suite: Suite,
                  selections: Selections) -> list[str]:
    """Per variant and budget: trials run, the best point and whether it is interior; then the task's counts."""
    metric = next((e.metric for e in entries if e.metric), None)
    rank = {entry.variant: i for i, entry in enumerate(_order(task, entries))}
    methods = {v.name: m for m in task.methods for v in m.variants()}
    lines, statuses, trials_per_method = [], [], {}
    for record in sorted(tuning, key=lambda r: (rank.get(r.variant, len(rank)), r.epsilon or 0.0)):
        method = methods.get(record.variant)
        if method is None:
            continue
        finished = [(lr, clip, value) for lr, clip, value, _ in record.trials if value is not None]
        earlier = task.earlier_trials(record.variant, record.epsilon)
        trials_per_method[record.label] = trials_per_method.get(record.label, 0) + len(record.trials) + earlier
        where = "" if record.epsilon is None else f", epsilon {record.epsilon:g}"
        selection = selections.get((task.name, record.variant, record.epsilon))
        if isinstance(selection, Selection):  # its trials and their number are not released: only the winner is
            outcome = "only the winner is released" if selection.lr is not None else selection.reason
            lines.append(f"- {record.label}{where}: tuned privately ({selection.law} number of trials, mean "
                         f"{selection.mean_trials:g}; validation score noise multiplier "
                         f"{selection.score_noise_multiplier:g}): {outcome}")
            continue
        if not finished:
            states = sorted({state for *_, state in record.trials})
            unscored = ("none scored yet: a total releases its noisy scores once every trial has run"
                        if "done" in states else "none finished")
            lines.append(f"- {record.label}{where}: {len(record.trials)} trial(s), {unscored} "
                         f"({', '.join(states)})")
            continue
        status = _search_status(task, method, record, suite, metric)
        statuses.append(status)
        lr, clip, value = best_trial(finished, maximize=metric != "loss")
        point = f"lr {lr:.3g}" + ("" if clip is None else f" clip {clip:.3g}")
        lines.append(f"- {record.label}{where}: {len(record.trials)} trials ({len(finished)} finished), best "
                     f"{point} -> {fmt_value(value, metric)}, {status}")
    if not lines:
        return []
    first = sum(s == "interior on the first range" for s in statuses)
    grown = sum(s == "interior after growing the range" for s in statuses)
    edge = sum(s.startswith("on the edge") for s in statuses)
    bracketed = sum(s.endswith(STEP_BRACKETED) for s in statuses)
    step = (f" ({bracketed} of them private SGD with {STEP_BRACKETED}: while every sample is clipped, SGD's step is "
            f"lr x clip times the mean clipped direction, its noise of the same scale, so an edge of lr or clip alone "
            f"need not limit the step's size; it can still limit the split between them)") if bracketed else ""
    counts = ", ".join(f"{label} {n}" for label, n in trials_per_method.items())
    discarded = (" (discarded earlier rounds included: each cell they preceded shows its total with them)"
                 if task.earlier_rounds else "")
    return [f"Tuning (validation {metric or 'metric'}, seed {suite.tuning_seed}): {len(statuses)} searches, {first} "
            f"with the optimum interior on the first range, {grown} interior after growing it, {edge} on the edge at "
            f"the search's limit{step}; ties between trials go to {TIE_RULE}. Trials per method, all budgets"
            f"{discarded}: {counts}.", "", *lines, ""]


def _search_status(task: Task, method: Method, record: Tuning, suite: Suite, metric: str | None) -> str:
    """Where the search's best trial lies: interior, or on the grid's edge at its limit (grid.optimum_status)."""
    return optimum_status([(lr, clip, value) for lr, clip, value, _ in record.trials],
                          task.lr[task.optimizer_of(method)], task.clip if method.private else None,
                          suite.tuning, maximize=metric != "loss",
                          step_is_product=method.private and task.optimizer_of(method) == "sgd")


def mark_edges(suite: Suite, entries: dict[str, list[Entry]], tuning: dict[str, list[Tuning]],
               selections: Selections) -> None:
    """Set each entry's on_edge from the search that chose its point (at its tuning budget), read from the scores
    the report may show (a total's released noisy scores; never a private tuning's, which releases only its
    winner). A private SGD search whose lr x clip is bracketed is not marked: its step's size was searched across."""
    for task in suite.tasks:
        task_entries = entries.get(task.name, [])
        metric = next((e.metric for e in task_entries if e.metric), None)
        methods = {v.name: m for m in task.methods for v in m.variants()}
        records = {(r.variant, r.epsilon): r for r in tuning.get(task.name, [])}
        for entry in task_entries:
            budget = suite.tuning_budget(entry.epsilon)
            record, method = records.get((entry.variant, budget)), methods.get(entry.variant)
            if (record is None or method is None or isinstance(selections.get((task.name, entry.variant, budget)),
                                                                Selection)
                    or not any(value is not None for _, _, value, _ in record.trials)):
                continue
            status = _search_status(task, method, record, suite, metric)
            entry.on_edge = status.startswith("on the edge") and not status.endswith(STEP_BRACKETED)


def _glance(suite: Suite, tasks: list[tuple[Task, list[Entry]]], judge: Judge) -> list[str]:
    """The table a reader scans first: per task and budget the best method (chosen on its selection runs), its paired
    margin over the best vanilla baseline, and its cost ratios against that baseline."""
    rows = []
    for task, entries in tasks:
        for epsilon in suite.budgets:
            measured = [e for e in entries if e.epsilon == epsilon and e.mean is not None]
            base = best_baseline(entries, epsilon)
            if not measured or base is None:
                continue
            best = best_of(measured)
            if not learned(best, task.chance):
                rows.append(f"| {task.title} | {epsilon:g} | none beats a constant prediction | - | - | - | - |")
                continue
            if best is base:
                margin, verdict = "(the baseline itself)", "-"
            else:
                test = better_test(best, base)
                margin = test.comparison.text() + judge.evidence(test) if test else "no common seed"
                verdict = judge.verdict(test)
            basis = "" if chosen_on_selection(measured) else " (chosen on the evaluation seeds)"
            if _unfinished(task, entries, epsilon, len(suite.seeds)):
                verdict = f"provisional: {verdict}" if verdict != "-" else "provisional"
            ratios = [fmt_ratio(best.cost(c), base.cost(c)) for c in ("peak_mb", "step_s")]
            rows.append(f"| {task.title} | {glance_budget(task, best)} | {named(best)} {fmt_entry(best)}{basis} | "
                        f"{named(base)} | "
                        f"{margin} | {verdict} | {ratios[0]} memory, {ratios[1]} time |")
    if not rows:
        return []
    return ["## At a glance", "",
            "Per task and budget: the best private method (mean [95% interval] over the evaluation seeds), chosen on "
            "its selection runs (the validation value of its chosen tuning trial, never the evaluation seeds; a "
            "row that had none says so), its margin over the best vanilla method (DP-SGD or DP-Adam, chosen the "
            "same way; the papers' claims below are judged against each paper's own baseline instead, the vanilla "
            "method with the claimed method's optimizer, so the two comparisons can differ) paired seed by seed with "
            "its 95% interval, p-value and Holm-adjusted p-value, whether it is "
            "better (holds / does not hold / not distinguishable at this budget, after the correction for the "
            "report's whole family of claims: see the claims section; \"provisional\" while a method of that budget "
            "has seeds still to run, as its choice and the family can still change), and its peak memory and time per "
            "step at that budget as multiples of the baseline's (shown, not judged: memory and speed claims are "
            "judged at the papers' scale, in Claims at scale). Scale: each task's title; device: the machine above.",
            "",
            "| task | epsilon | best method | best vanilla method | margin over it | better? | cost vs it |",
            "|---|---|---|---|---|---|---|", *rows, ""]


def _unfinished(task: Task, entries: list[Entry], epsilon: float, seeds: int) -> bool:
    """Whether a private method of the task has no cell at `epsilon` yet, or one of its variants there has not run
    (or refused) all its evaluation seeds. A ladder's rungs past the one above the smallest that reaches a budget are
    never run there, so a method counts as started by any of its rungs."""
    at = {e.variant: e for e in entries if e.epsilon == epsilon}
    for method in (m for m in task.methods if m.private):
        started = [at[v.name] for v in method.variants() if v.name in at]
        if not started:
            return True
        for entry in started:
            if not entry.refused and (entry.pending or entry.finished + len(entry.failed) < seeds):
                return True
    return False


def _anchor_lines(task: Task, entries: list[Entry], selections: Selections, suite: Suite) -> list[str]:
    """Each published figure beside the cell that reproduces it (or that none has run); where that cell's budget is a
    total over several runs, its per-run epsilon, which is not the paper's one-run budget."""
    lines = []
    for anchor in task.anchors:
        ours = next((e for e in entries if e.method == anchor.method and e.epsilon == anchor.epsilon
                     and e.mean is not None), None)
        budget = "non-private" if anchor.epsilon is None else f"epsilon {anchor.epsilon:g}"
        metric = ours.metric if ours else "accuracy"
        measured = (f"{ours.label} here {fmt_entry(ours)}, {100 * (ours.mean - anchor.value):+.1f} points"
                    if ours and metric == "accuracy" else f"{ours.label} here {fmt_entry(ours)}" if ours
                    else "not run here yet")
        total = None if ours is None else selections.get((task.name, ours.variant, suite.tuning_budget(ours.epsilon)))
        if isinstance(total, TotalBudget) and total.per_run is not None:
            sibling = _at_paper_noise(suite, task, anchor.method)
            measured += (f" (at a total of {budget} over {counted(total.trials + total.finals, 'run')}: "
                         f"{total.per_run:.2f} a run, not the paper's one run at {budget}; "
                         + (f"`{sibling.name}` runs it at the paper's noise, like for like)" if sibling else
                            "no run here at the paper's own noise)"))
        lines.append(f"- {anchor.source}: {fmt_value(anchor.value, metric)} at {budget}; {measured}")
    return ["Published figures this task reproduces:", "", *lines, ""] if lines else []


def _at_paper_noise(suite: Suite, task: Task, method: str) -> Task | None:
    """The task that runs `task`'s setting (the same overrides) and `method` at its paper's own noise, if any."""
    return next((other for other in suite.tasks if other.noise_multiplier is not None and other is not task
                 and other.overrides == task.overrides and any(m.name == method for m in other.methods)), None)


def _planned(suite: Suite, cell: dict[str, Any]) -> bool:
    """Whether the suite as it stands would run this recorded cell as it was run: a method or a budget since dropped
    from a task (D2P2's setting once ran epsilon 3) is stale, not a result, and so is a cell whose overrides differ
    from those the suite file now gives it (the suite runs it again: cells.recorded)."""
    for task in suite.tasks:
        if task.name != cell.get("task"):
            continue
        found = next(((method, variant) for method in task.methods for variant in method.variants()
                      if variant.name == cell.get("variant")), None)
        if found is None:
            return False
        budgets = task.budgets or suite.budgets
        allowed = {*budgets, *(suite.tuning_budget(b) for b in budgets)}
        epsilon = None if cell.get("epsilon") is None else float(cell["epsilon"])
        return (epsilon is None or epsilon in allowed) and _rebuilt(suite, task, *found, cell) == cell.get("overrides")
    return False


def _rebuilt(suite: Suite, task: Task, method: Method, variant: Variant, cell: dict[str, Any]) -> list[str]:
    """The overrides the suite file gives this cell now, at its recorded point, seed and noise."""
    noise = next((item.split("=", 1)[1] for item in cell.get("overrides") or []
                  if item.startswith("privacy.noise_multiplier=")), "null")
    return cell_for(suite, task, method, variant, cell["phase"], cell.get("epsilon"), cell["seed"], cell.get("trial"),
                    cell["lr"], cell.get("clip_norm"), None if noise == "null" else float(noise)).overrides


@dataclass
class _Found:
    """What the report is built from: the suite's cells under root and the records beside them."""

    outcomes: list[Outcome]
    stale: int
    entries: dict[str, list[Entry]]
    tuning: dict[str, list]
    selections: dict
    runs: list[dict]
    commits: CommitCheck


@dataclass
class _Verdicts:
    """Every part of the report that states a verdict: written twice by judge_all, so that they form one family."""

    glance: list[str]
    winners: dict[str, list[str]]
    claims: list[str]


def build(suite: Suite, root: Path, docs: Path, command: str, allow_mixed_commits: bool = False) -> Path:
    """Write docs/leaderboard.md, docs/leaderboard/cells.csv and the figures; return the markdown's path. Refuses
    (ConfigurationError) cells whose privacy-relevant code may differ unless `allow_mixed_commits`."""
    root, docs = Path(root), Path(docs)
    found = _read(suite, root, allow_mixed_commits)
    figures = docs / "leaderboard"
    _reset_figures(figures)
    _write_cells_csv(found.outcomes, root, figures / "cells.csv", found.selections)
    judged = _judged_tasks(suite, found)
    verdicts, family = judge_all(lambda judge: _verdicts(suite, judged, judge))
    lines = _preamble(suite, root, found, command) + _tasks_not_run(suite, found)
    task_lines, panels = _task_sections(suite, found, figures, verdicts.winners)
    headline = headline_plot(panels, figures / "headline.png")
    lines += verdicts.glance + (["![metric vs epsilon, every task](leaderboard/headline.png)", ""]
                                if headline else [])
    lines += task_lines + _claims_section(suite, verdicts.claims, family)
    lines += costs_section(figures / "costs", figures / "cells.csv", [task.name for task in suite.tasks],
                           suite.tune_epsilon)
    lines += scale_section(figures / "frontier")
    path = docs / "leaderboard.md"
    path.write_text("\n".join(lines))
    return path


def _judged_tasks(suite: Suite, found: _Found) -> list[tuple[Task, list[Entry]]]:
    """The tasks whose metric is ranked (not cost-only) and that have entries, each with its entries in order."""
    judged = []
    for task in suite.tasks:
        entries = _order(task, found.entries.get(task.name, []))
        if entries and not task.cost_only:
            judged.append((task, entries))
    return judged


def _verdicts(suite: Suite, judged: list[tuple[Task, list[Entry]]], judge: Judge) -> _Verdicts:
    """The glance table, each task's winners and the papers' claims, with the verdicts `judge` gives."""
    winners_by_task = {task.name: winners(entries, suite.budgets, task.chance, judge) for task, entries in judged}
    claims = check_claims([(_claim_title(task), entries, task.chance) for task, entries in judged], suite.budgets,
                          judge)
    return _Verdicts(_glance(suite, judged, judge), winners_by_task, claims)


def _claim_title(task: Task) -> str:
    """The task's title, with what was cut from its paper's setting where the machine could not run it."""
    return f"{task.title} (reduced: {task.reduced})" if task.reduced else task.title


def _read(suite: Suite, root: Path, allow_mixed_commits: bool) -> _Found:
    found = read_outcomes(root)
    outcomes = [o for o in found if _planned(suite, o.cell)]
    commits = require_one_code([o.cell for o in outcomes if o.status in ("done", "refused")], root,
                               allow_mixed_commits)
    entries, tuning = summarize(outcomes)
    selections = read_selections(root, suite)
    release_only_noisy_scores(tuning, selections)
    attach_selection(entries, tuning, suite.tuning_budget, skip=lambda e: isinstance(
        selections.get((e.task, e.variant, suite.tuning_budget(e.epsilon))), Selection))
    mark_edges(suite, entries, tuning, selections)
    runs_path = root / RUNS_FILE
    runs = json.loads(runs_path.read_text()) if runs_path.exists() else []
    return _Found(outcomes, len(found) - len(outcomes), entries, tuning, selections, runs, commits)


def _fewer_budgets(suite: Suite) -> str:
    """' (the ViT at 3 and 8 only; ...)': the tasks that run fewer of the profile's budgets."""
    fewer = [f"{task.name} at {' and '.join(f'{b:g}' for b in task.budgets)} only" for task in suite.tasks
             if task.budgets and tuple(task.budgets) != tuple(suite.budgets)]
    return f" ({'; '.join(fewer)})" if fewer else ""


def _reset_figures(figures: Path) -> None:
    figures.mkdir(parents=True, exist_ok=True)
    for drawn in [*figures.glob("*_epsilon.png"), *figures.glob("*_cost.png")]:  # every task's are redrawn
        drawn.unlink()


def _write_cells_csv(outcomes: list[Outcome], root: Path, path: Path, selections: Selections) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(csv_rows(outcomes, root, released_scores(selections)))


def _preamble(suite: Suite, root: Path, found: _Found, command: str) -> list[str]:
    """The header: what was run, where, how long, and the protocol every number below follows."""
    outcomes, stale, runs, selections = found.outcomes, found.stale, found.runs, found.selections
    cell_wall = sum(float(o.cell.get("process_wall_s") or 0.0) for o in outcomes)
    counts = {state: sum(o.status == state for o in outcomes) for state in ("done", "refused", "failed", "pending")}
    return [
        "# dpbench leaderboard",
        "",
        f"<!-- generated by `{command}`; never edit by hand: regenerate with `python -m dpbench.leaderboard "
        f"--report-only{' --quick' if suite.profile == 'quick' else ''}` -->",
        "",
        f"**Profile: `{suite.profile}`**" + (" — the reduced smoke configuration (a few epochs, two tuning trials, "
                                             "one seed): its numbers show the machinery, not the methods' "
                                             "potential. The full suite is `python -m dpbench.leaderboard`."
                                             if suite.profile == "quick" else ""),
        "",
        f"- Generated {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} from {len(outcomes)} cells "
        f"under `{root}` ({counts['done']} done, {counts['refused']} refused, {counts['failed']} failed, "
        f"{counts['pending']} pending); suite file `{suite.path.name}`"
        + (f"; left out: {stale} cell(s) of methods, rungs or budgets the suite no longer runs, or recorded with "
           "other settings than the suite file now gives them (the suite runs them again)" if stale else "") + ".",
        f"- Machine: {runs[-1]['machine'] if runs else machine()}.",
        f"- Wall time: {cell_wall:.0f} s summed over the cells' processes"
        + (f"; suite invocations: {_invocations(runs)}" if runs else "")
        + ".",
        f"- Budgets: {'total ' if suite.total else ''}epsilon {', '.join(f'{b:g}' for b in suite.budgets)}"
        f"{_fewer_budgets(suite)}; {_deltas(suite)}, each below 1/N, N the task's training-set size (a run "
        "refuses a delta at or above it).",
        *([f"- What this profile runs, and why: {suite.choice}"] if suite.choice else []),
        _fairness(suite),
        *_protocol(suite),
        found.commits.report_line(),
        ("- **Private tuning**: each private method's tuning is Papernot & Steinke's private selection (a secret "
         "random number of trials over its grid, noisy validation scores, only the winner released), accounted with "
         "dp-accounting's RepeatAndSelectDpEvent and composed with the final run: each cell shows its epsilon per run "
         "and with tuning. JL's and D2P2's random-sensitivity steps enter as Renyi bounds with their scale's "
         "dangerous tail left out and charged to delta; where that bound is infinite (JL at few projections) the "
         "cell says not accounted." if any(isinstance(r, Selection) for r in selections.values()) else
         _total_line(suite) + "\n" + _resolution_line(suite) if suite.total else
         "- **The epsilon of each run does not count the tuning**: choosing among the trials on private data spends "
         "privacy that no figure here includes (`--private-tuning` tunes privately and counts it)."),
        "- A method dpbench refuses at a budget (no noise reaches it, or a setting it needs is missing) is shown as "
        "`refused at epsilon X: <dpbench's reason>`; JL runs the smallest r that reaches each budget and one larger "
        "r.",
        "- Costs (samples/s and seconds per training step, both over the steps after the profiler's warm-up; peak "
        "memory above the process's start; training wall time without the per-epoch epsilon accounting) "
        f"are the median over seeds at epsilon {suite.tune_epsilon:g} unless noted (cells run two at a time, and a "
        "run beside a heavier cell is slower); raw per-cell figures: "
        f"[leaderboard/cells.csv](leaderboard/cells.csv). {_memory_note(outcomes)}",
        "",
    ]


def _fairness(suite: Suite) -> str:
    """How every method is tuned: the same K points of the same grid, or (a per-run smoke profile) a growing grid."""
    tuning = suite.tuning
    if tuning.grows:
        search = (f"searches the same grid over learning rate and clip norm ({tuning.lr_points} x {tuning.clip_points} "
                  f"log-spaced points of the task's ranges; a non-private method {suite.trials} learning rates over "
                  f"the same range), grown past an edge while the best trial lies on it, up to {tuning.max_growth:g}x "
                  f"beyond each end of a range (the search's limit, reported; not a headline protocol: the methods' "
                  f"trial counts then differ)")
    else:
        search = (f"runs the same {counted(suite.trials, 'trial')} at each tuning budget: the first {suite.trials} "
                  f"points, in one fixed shuffled order, of the same grid over learning rate and clip norm "
                  f"({tuning.lr_points} x {tuning.clip_points} log-spaced points of the task's ranges; a non-private "
                  f"method {tuning.lr_points * tuning.clip_points} learning rates over the same range), never grown")
    choice = ("the trial with the best released noisy validation score is chosen" if suite.total else
              "the best trial by validation value is chosen")
    return (f"- Fairness: every method {search}, with the selection seed {suite.tuning_seed} on a validation split "
            "carved from the training data, "
            + ("at each budget; " if tuning.each_budget else f"at epsilon {suite.tune_epsilon:g}, the choice reused "
               "at every budget; ")
            + f"{choice}, ties broken by {TIE_RULE}"
            + ("; where a task's range moved mid-run, the methods it moved for ran a discarded earlier round, which "
               "its note names and each such cell's total counts beside it (those methods had more trials than the "
               "others)" if any(task.earlier_rounds for task in suite.tasks) else "")
            + f". Evaluation seeds {', '.join(map(str, suite.seeds))} (none of "
            "them a selection seed) then train on the whole training set at the chosen point (the same epochs, so "
            "more steps than a trial: the point is chosen at the trials' length) and are evaluated on the test split: "
            "mean [95% Student-t interval] over seeds. Each rung of a ladder (JL's r) is tuned on its "
            "own.")


def _score_noises(suite: Suite) -> str:
    """'20' or '20 at epsilon 1, 10 at epsilon 3, ...'."""
    noise = suite.tuning.score_noise
    if not isinstance(noise, dict):
        return f"{noise:g}"
    return ", ".join(f"{noise[budget]:g} at epsilon {budget:g}" for budget in suite.budgets)


def _resolution_line(suite: Suite) -> str:
    """The selection's resolution beside the intervals it must stay below: the released score's noise standard
    deviation z/n in percent of the score's range (points of accuracy), per task and budget."""
    rows = []
    for task in suite.tasks:
        if task.skip_reason() or task.fixed or task.cost_only:
            continue
        budgets = task.budgets or suite.budgets
        spread = ", ".join(f"{100 * suite.tuning.score_noise_at(b) / task.validation_size:.2g} at epsilon {b:g}"
                           for b in budgets)
        rows.append(f"{task.name} (n = {task.validation_size:,}): {spread}")
    return ("- Selection's resolution (the released score's noise standard deviation z/n, in percent of the score's "
            "range: points of accuracy, or percent of a loss task's cap on each example's loss): " + "; ".join(rows)
            + ". This is the score's noise alone: each trial is also one seed's training run, whose seed-to-seed "
            "spread (several points on the harder tasks: each cell's interval shows it at the chosen point) and the "
            "validation sample's own error add to it. A trial is told apart from another only by more than about "
            "twice their sum, so the chosen point, and the best method picked by its selection score, are noisy "
            "picks; the verdicts rest on the evaluation seeds, not on the selection.")


def _total_line(suite: Suite) -> str:
    return (f"- **Each budget is a total, tuning included**: a private cell's epsilon is what its whole procedure "
            f"spends on the data, the composition (dpbench's accountant, the same for every method) of its "
            f"{counted(suite.trials, 'trial')}, each trial's validation score released with Gaussian noise "
            f"(noise multiplier {_score_noises(suite)} in units of its sensitivity: 1/n for accuracy; B/n for a task "
            f"scored by a loss, whose score is its validation loss with each example's loss capped at the task's B, "
            f"{NegativeSamplingTask.score_bound:g} for word2vec), and its "
            f"{counted(len(suite.seeds), 'final run')}, one per evaluation seed, each released; every run's noise is "
            "calibrated so that this total meets the budget. Each cell shows the total and one final run's epsilon "
            "(per run). The trials' exact validation values are not released: the tuning summary and cells.csv show "
            "their noisy scores. Only a task scored by a loss that declares no bound (a plugin's) releases no noisy "
            "score: its choice uses the exact loss, and its cell says that selection is not accounted.")


def _protocol(suite: Suite) -> list[str]:
    """Selection apart from evaluation, divergence and the correction for multiple claims, as the report applies
    them."""
    seeds = ("" if len(suite.seeds) >= MIN_EVALUATION_SEEDS else
             f" **This smoke profile runs {counted(len(suite.seeds), 'evaluation seed')}, fewer than the protocol's "
             f"{MIN_EVALUATION_SEEDS}: its intervals and verdicts show the machinery only.**")
    return [
        "- Selection apart from evaluation: hyperparameters, the best method of a budget and the vanilla method it "
        "is compared with are chosen on the selection runs (each method's validation value at its chosen trial); "
        "the evaluation seeds only measure them. A paper's claim is judged against its paper's baseline, fixed "
        "before any result: the vanilla method with the claimed method's optimizer (DP-SGD for JL and D2P2, DP-Adam "
        "for GRAPE and sparse). A choice with no selection run behind it (a published recipe, a private tuning "
        "whose scores are not released) is made on the evaluation seeds and says so." + seeds,
        f"- Divergence: {DIVERGENCE_RULE}. Each cell counts its diverged seeds (\"2/5 diverged\"); a diverged seed "
        "with a finite value stays in the mean and in the paired comparisons (it is what the method gave at that "
        "seed), one without a finite value has none and is left out of both.",
        f"- Verdicts: paired seed by seed, each claim's two-sided paired t test Holm-corrected over the report's whole "
        f"family of claims at family-wise alpha {ALPHA:g} (the family's size is given with the papers' claims); "
        "\"holds\" only after the correction (a \"close\" claim's two-sided test against its margin is a one-sided "
        f"non-inferiority test at {ALPHA / 2:g}; a loss has no margin, so its \"close\" is tested as \"better\"). "
        "The Claims at scale section's verdicts are single measurements, descriptive and outside this family. "
        "Intervals and tests are conditional on the one selection run of each method and budget (its trials at the "
        "selection seed and their noisy scores: a second selection could choose another point) and on the task's "
        "fixed test split: they measure the evaluation seeds' training randomness, not the selection's variance or "
        "the test sample's." + _normality(len(suite.seeds)),
        "- Ranges: each task's learning-rate and clip-norm ranges are fixed in the suite file before its trials and "
        "taken as given; a total accounts for the search within them, not for how they were set. The developers set "
        "them from earlier runs, some on these same data sets (the suite file's comments cite them), which no epsilon "
        "here counts; a task whose ranges were moved during this run says so, with the discarded trials.",
    ]


def _normality(seeds: int) -> str:
    """What the paired t test assumes at this many seeds: an exact sign-flip test's smallest two-sided p is
    2 / 2^seeds, which at 5 seeds cannot reach 0.05."""
    if seeds < 2:
        return ""
    smallest = 2 / 2**seeds
    return (f" With {seeds} paired seeds the t test leans on the differences being near normal: an exact sign-flip "
            f"test's smallest two-sided p is 2/2^{seeds} = {smallest:.3g}"
            + (f", so no distribution-free test of one claim could reject at {ALPHA:g}." if smallest > ALPHA else "."))


def _memory_note(outcomes: list[Outcome]) -> str:
    """What the CPU memory columns measure: the working set where every cell recorded it, else (cells from before
    dpbench measured it) the resident high-water mark, said as such."""
    methods = [str((o.results or {}).get("memory_method") or "") for o in outcomes if o.results]
    if methods and all(method.startswith("working set") for method in methods):
        return ("On CPU the peak is the working set: the peak of the bytes malloc holds in use over the warm-up steps "
                "(dpbench/profiling/working_set.py), which neither the allocator's retention nor the other cell on "
                "the machine moves; on CUDA it is max_memory_reserved.")
    return ("On CPU the peak is the resident high-water mark, which also holds freed memory that the allocator keeps "
            "across steps of different (Poisson) batch sizes and that grows over a run, so CPU memory columns rank "
            "processes rather than the methods' working sets (BENCHMARKS.md, 2026-11-27); on CUDA it is "
            "max_memory_reserved.")


def _tasks_not_run(suite: Suite, found: _Found) -> list[str]:
    lines: list[str] = []
    skipped = [f"- {task.title} (`{task.name}`): {task.skip_reason()}" for task in suite.tasks if task.skip_reason()]
    skipped += [f"- `{name}`: not in the `{suite.profile}` profile" for name in suite.omitted]
    if skipped:
        lines += ["Tasks not run:", "", *skipped, ""]
    waiting = [f"- {task.title} (`{task.name}`)" for task in suite.tasks
               if not task.skip_reason() and not found.entries.get(task.name) and not found.tuning.get(task.name)]
    if waiting:
        lines += ["Tasks the suite has not reached yet (no cell has run; the same command continues the suite):", "",
                  *waiting, ""]
    return lines


def _published(task: Task, entries: list[Entry], drawn: list[Entry]) -> list[tuple[str, float, float]]:
    """The task's published figures as its figures draw them: (method label, epsilon, value), each at the epsilon
    its cell is drawn at (a run at the paper's noise at its own per-run epsilon), in its method's style."""
    labels = {variant.name: variant.label for method in task.methods for variant in method.variants()}
    at = {(entry.method, entry.epsilon): shown.epsilon for entry, shown in zip(entries, drawn, strict=True)}
    return [(labels.get(a.method, a.method), at.get((a.method, a.epsilon), a.epsilon), a.value)
            for a in task.anchors if a.epsilon is not None]


def _task_sections(suite: Suite, found: _Found, figures: Path,
                   winners_by_task: dict[str, list[str]]) -> tuple[list[str], list]:
    """Each task's table, tuning, winners and figures; and what the headline plot takes."""
    entries, tuning, selections = found.entries, found.tuning, found.selections
    panels, cost_only = [], []
    lines = ["## Results per task", ""]
    for task in suite.tasks:
        task_entries = _order(task, entries.get(task.name, []))
        if not task_entries and not tuning.get(task.name):
            continue
        if task.cost_only:
            cost_only.append((task, task_entries))
            continue
        metric = next((e.metric for e in task_entries if e.metric), None)
        lines += [f"### {task.title}", "", f"`{task.name}`: test {metric or 'metric'} "
                  f"({'lower' if metric == 'loss' else 'higher'} is better); each cell: mean [95% interval] over "
                  f"seeds (the {'recipe' if task.fixed else 'tuned'} learning rate and clip norm).", ""]
        if task.note:
            lines += [task.note, ""]
        if task.reduced:
            lines += [f"Reduced from the paper's own setting: {task.reduced}.", ""]
        lines += _at_budget_lines(task)
        if task.fixed:
            lines += [f"Not tuned: every method runs at the published recipe's learning rate {task.fixed[0]:g}"
                      + ("" if task.fixed[1] is None else f" and clip norm {task.fixed[1]:g}") + ".", ""]
        lines += _task_table(task, task_entries, suite, selections)
        lines += _anchor_lines(task, task_entries, selections, suite)
        lines += accountant_lines(task, found.outcomes)
        lines += _tuning_lines(task, tuning.get(task.name, []), task_entries, suite, selections)
        best = winners_by_task.get(task.name, [])
        if best:
            lines += ["Winner per budget (chosen on the selection runs, paired over the evaluation seeds against the "
                      "best vanilla method, Holm-corrected over the report's claims):", "",
                      *(f"- {line}" for line in best), ""]
        drawn, total = placed(task, task_entries), suite.total and task.noise_multiplier is None
        published = _published(task, task_entries, drawn)
        for figure in (epsilon_plot(drawn, task.title, task.delta, figures / f"{task.name}_epsilon.png",
                                    published, task.chance, total=total),
                       cost_plot(task_entries, suite.tune_epsilon, task.title, figures / f"{task.name}_cost.png",
                                 task.chance)):
            if figure:
                lines += [f"![{figure.stem}](leaderboard/{figure.name})", ""]
        panels.append((task.title, drawn, task.delta, published, task.chance, total))
    if cost_only:
        lines += ["## Cost only: tasks where nothing learns at these budgets", "",
                  "Their speed and memory are measured like every other task's; their metric is not ranked.", ""]
        for task, task_entries in cost_only:
            lines += [f"### {task.title}", "", f"`{task.name}`", ""]
            if task.note:
                lines += [task.note, ""]
            lines += _cost_table(task, task_entries, suite)
    return lines, panels


def _at_budget_lines(task: Task) -> list[str]:
    """The settings a method takes at one budget only (the suite's at_budget): part of what its cells ran."""
    if not task.at_budget:
        return []
    labels = {method.name: method.label for method in task.methods}
    settings = "; ".join(f"{labels[name]} at epsilon {budget:g}: `{' '.join(overrides)}`"
                         for name, budget, overrides in task.at_budget)
    return [f"Set per budget (the suite file's at_budget, in those cells' overrides): {settings}.", ""]


def _claims_section(suite: Suite, claims: list[str], family: Family) -> list[str]:
    lines = ["## The papers' headline claims against this table", "",
             "Each verdict pairs the method seed by seed with its paper's baseline, the vanilla method with its "
             "optimizer (DP-SGD for JL and D2P2, DP-Adam for GRAPE and sparse; the other one, said so, where a task "
             "does not run it): holds, does not hold, or not distinguishable at this budget (the claim's test is "
             "not rejected after the correction below). \"Better\" tests a paired difference of 0; \"close\" (JL's "
             f"and GRAPE's accuracy) is non-inferiority, a test against -{CLOSE_POINTS:g} points, so the same pair "
             "shows a different p-value under each claim. A method marked \"tuned on its grid's edge\" had its best "
             "trial on the edge of its search's range at the search's limit: a better point may lie outside, so a "
             "verdict against it may flatter the other side, and one for it may understate it.", "",
             f"Multiple comparisons. {family.describe()}", ""]
    if suite.smoke:
        lines += [f"The `{suite.profile}` profile is a smoke profile ({counted(len(suite.seeds), 'evaluation seed')}): "
                  "these verdicts exercise the checks, they say nothing about the papers.", ""]
    lines += [f"- {sentence}" for sentence in claims] or ["- No claim can be checked from these cells."]
    lines.append("")
    return lines


