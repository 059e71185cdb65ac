"""docs/leaderboard.md, its per-cell CSV and figures, generated from the cells' own results.json files only."""

from __future__ import annotations

import csv
import json
import os
import platform
from datetime import datetime, timezone
from pathlib import Path

import torch

from dpbench.leaderboard.cells import Outcome, read_outcomes
from dpbench.leaderboard.claims import check_claims, fmt_value, winners
from dpbench.leaderboard.plots import cost_plot, epsilon_plot, headline_plot
from dpbench.leaderboard.scale import scale_section
from dpbench.leaderboard.suite import Suite, Task
from dpbench.leaderboard.summary import Entry, Tuning, seconds_per_step, summarize

RUNS_FILE = "suite_runs.json"
CSV_COLUMNS = ("task", "method", "variant", "label", "phase", "status", "reason", "target_epsilon", "epsilon_spent",
               "delta", "seed", "trial", "lr", "clip_norm", "metric", "test_value", "validation_value",
               "samples_per_s", "peak_memory_mb", "train_time_s", "steps", "s_per_step", "noise_multiplier",
               "process_wall_s", "cell")


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


def csv_rows(outcomes: list[Outcome], root: Path) -> list[dict]:
    rows = []
    for outcome in outcomes:
        cell, results = outcome.cell, outcome.results or {}
        rows.append({
            "task": cell["task"], "method": cell["method"], "variant": cell["variant"], "label": cell["label"],
            "phase": cell["phase"], "status": outcome.status, "reason": outcome.reason or "",
            "target_epsilon": cell["epsilon"], "epsilon_spent": results.get("epsilon"), "delta": results.get("delta"),
            "seed": cell["seed"], "trial": cell["trial"], "lr": cell["lr"], "clip_norm": cell["clip_norm"],
            "metric": outcome.metric, "test_value": outcome.value("test"),
            "validation_value": outcome.value("validation"), "samples_per_s": results.get("samples_per_s"),
            "peak_memory_mb": results.get("peak_memory_mb"), "train_time_s": results.get("train_time_s"),
            "steps": results.get("steps"), "s_per_step": seconds_per_step(results) if results else None,
            "noise_multiplier": results.get("noise_multiplier"), "process_wall_s": cell.get("process_wall_s"),
            "cell": str(outcome.path.relative_to(root)),
        })
    return rows


def _deltas(suite: Suite) -> str:
    """'delta 1e-05 for every task', or the suite's delta and the tasks that set their own."""
    own = [f"{task.title}: {task.delta:g}" for task in suite.tasks if task.delta != suite.delta]
    return f"delta {suite.delta:g} for every task" + (f" but {'; '.join(own)}" if own else "")


def _order(task: Task, entries: list[Entry]) -> list[Entry]:
    rank = {}
    for i, method in enumerate(task.methods):
        for j, variant in enumerate(method.variants()):
            rank[variant.name] = (i, j)
    return sorted(entries, key=lambda e: (rank.get(e.variant, (99, 0)), e.epsilon or 0.0))


def _cell_text(entry: Entry | None, notes: list[str]) -> str:
    """The table's text for one entry; a refusal's reason goes to the numbered notes under the table."""
    if entry is None:
        return "-"
    if entry.refused:
        note = f"cannot reach epsilon {entry.epsilon:g}: {entry.refused}"
        if note not in notes:
            notes.append(note)
        return f"cannot reach epsilon {entry.epsilon:g} [{notes.index(note) + 1}]"
    if entry.mean is not None:
        spread = f" ± {fmt_value(entry.std, entry.metric)}" if entry.std is not None else ""
        text = fmt_value(entry.mean, entry.metric) + spread
        if entry.failed or entry.pending:
            text += f" ({len(entry.values)} seeds; {len(entry.failed)} failed, {entry.pending} pending)"
        return text
    if entry.failed:
        return f"failed: {entry.failed[0]}"
    return "pending"


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _task_table(task: Task, entries: list[Entry], tuning: list[Tuning], suite: Suite) -> list[str]:
    columns = [f"epsilon {b:g}" for b in suite.budgets]
    lines = ["| method | lr | clip | " + " | ".join(columns) + " | non-private | samples/s | peak MB | s/step | "
             "wall s |", "|---" * (len(columns) + 8) + "|"]
    variants: dict[str, list[Entry]] = {}
    for entry in _order(task, entries):
        variants.setdefault(entry.variant, []).append(entry)
    notes: list[str] = []
    for _variant, group in variants.items():
        by_eps = {e.epsilon: e for e in group}
        reference = by_eps.get(suite.tune_epsilon) or next((e for e in group if e.mean is not None), group[0])
        if reference.mean is None:
            reference = next((e for e in group if e.mean is not None), reference)
        cost_note = "" if reference.epsilon in (suite.tune_epsilon, None) else f" (at epsilon {reference.epsilon:g})"
        cells = [_cell_text(by_eps.get(b), notes) if None not in by_eps else "" for b in suite.budgets]
        nonprivate = _cell_text(by_eps.get(None), notes) if None in by_eps else ""
        ran = any(e.values for e in group)  # a rung refused everywhere never used its hyperparameters
        lr, clip = (reference.lr, reference.clip_norm) if ran else (None, None)
        lines.append(
            f"| {group[0].label} | {_number(lr, '.3g')} | {_number(clip, '.3g')} | "
            + " | ".join(cells) + f" | {nonprivate} | {_number(reference.cost('samples_per_s'), '.0f')} | "
            f"{_number(reference.cost('peak_mb'), '.0f')} | {_number(reference.cost('step_s'), '.3f')} | "
            f"{_number(reference.cost('wall_s'), '.1f')}{cost_note} |"
        )
    lines.append("")
    if notes:
        lines += [f"[{i}] {note}" + ("  " if i < len(notes) else "") for i, note in enumerate(notes, 1)] + [""]
    tuned = []
    rank = {entry.variant: i for i, entry in enumerate(_order(task, entries))}
    for record in sorted(tuning, key=lambda r: rank.get(r.variant, len(rank))):
        finished = [t for t in record.trials if t[2] is not None]
        points = ", ".join(f"lr {lr:.3g}" + (f" clip {clip:.3g}" if clip is not None else "")
                           + f" -> {fmt_value(value, entries[0].metric if entries else None)}"
                           if value is not None else f"lr {lr:.3g} ({state})" for lr, clip, value, state in
                           record.trials)
        tuned.append(f"- {record.label}: {len(finished)}/{len(record.trials)} trials finished ({points})")
    if tuned:
        lines += [f"Tuning trials (validation {entries[0].metric if entries else 'metric'}, seed 0, private methods "
                  f"at epsilon {suite.tune_epsilon:g}):", "", *tuned, ""]
    return lines


def build(suite: Suite, root: Path, docs: Path, command: str) -> Path:
    """Write docs/leaderboard.md, docs/leaderboard/cells.csv and the figures; return the markdown's path."""
    root, docs = Path(root), Path(docs)
    named = {(task.name, variant.name) for task in suite.tasks for method in task.methods
             for variant in method.variants()}
    found = read_outcomes(root)
    outcomes = [o for o in found if (o.cell.get("task"), o.cell.get("variant")) in named]
    stale = len(found) - len(outcomes)
    figures = docs / "leaderboard"
    figures.mkdir(parents=True, exist_ok=True)
    rows = csv_rows(outcomes, root)
    with (figures / "cells.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    entries, tuning = summarize(outcomes)
    runs_path = root / RUNS_FILE
    runs = json.loads(runs_path.read_text()) if runs_path.exists() else []
    cell_wall = sum(float(o.cell.get("process_wall_s") or 0.0) for o in outcomes)
    counts = {state: sum(o.status == state for o in outcomes) for state in ("done", "refused", "failed", "pending")}

    lines = [
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
        + (f"; left out: {stale} cell(s) of methods or rungs the suite no longer names" if stale else "") + ".",
        f"- Machine: {runs[-1]['machine'] if runs else machine()}.",
        f"- Wall time: {cell_wall:.0f} s summed over the cells' processes"
        + (f"; suite invocations: {_invocations(runs)}" if runs else "")
        + ".",
        f"- Budgets: epsilon {', '.join(f'{b:g}' for b in suite.budgets)} at {_deltas(suite)} (below 1/N^1.1 for "
        "every training set here).",
        f"- Fairness: every method gets the same {suite.trials} tuning trials over its learning rate and clip norm "
        "(the same log-scale Halton points of the task's ranges), run at epsilon "
        f"{suite.tune_epsilon:g} with seed 0 on a validation split carved from the training data; the best trial by "
        f"validation metric is reused at every budget, and seed(s) {', '.join(map(str, suite.seeds))} are trained on "
        "the whole training set and evaluated on the test split (mean ± std over seeds). Each rung of a ladder (JL's "
        "r) shown is tuned on its own with the same trials; a rung refused at the tuning budget runs at the first "
        "trial's point, which records its refusal.",
        "- **The epsilon of each run does not count the tuning**: choosing among the trials on private data spends "
        "privacy that no figure here includes.",
        "- A method that cannot reach a budget is shown as `cannot reach epsilon X: <dpbench's reason>`; JL runs "
        "the smallest r that reaches each budget and one larger r.",
        "- Costs (samples/s, peak memory above the process's start, seconds per training step, training wall time) "
        f"are at epsilon {suite.tune_epsilon:g} unless noted; raw per-cell figures: "
        "[leaderboard/cells.csv](leaderboard/cells.csv).",
        "",
    ]
    skipped = [f"- {task.title} (`{task.name}`): {task.skip_reason()}" for task in suite.tasks if task.skip_reason()]
    skipped += [f"- `{name}`: not in the `{suite.profile}` profile" for name in suite.omitted]
    if skipped:
        lines += ["Tasks not run:", "", *skipped, ""]
    panels, claim_inputs = [], []
    lines += ["## Results per task", ""]
    for task in suite.tasks:
        task_entries = _order(task, entries.get(task.name, []))
        if not task_entries and not tuning.get(task.name):
            continue
        metric = next((e.metric for e in task_entries if e.metric), None)
        lines += [f"### {task.title}", "", f"`{task.name}`: test {metric or 'metric'} "
                  f"({'lower' if metric == 'loss' else 'higher'} is better).", ""]
        if task.note:
            lines += [task.note, ""]
        lines += _task_table(task, task_entries, tuning.get(task.name, []), suite)
        best = winners(task_entries, suite.budgets, task.chance)
        if best:
            lines += ["Winner per budget:", "", *(f"- {line}" for line in best), ""]
        for figure in (epsilon_plot(task_entries, task.title, task.delta, figures / f"{task.name}_epsilon.png"),
                       cost_plot(task_entries, suite.tune_epsilon, task.title, figures / f"{task.name}_cost.png")):
            if figure:
                lines += [f"![{figure.stem}](leaderboard/{figure.name})", ""]
        panels.append((task.title, task_entries, task.delta))
        claim_inputs.append((task.title, task.optimizer, task_entries, task.chance))
    headline = headline_plot(panels, figures / "headline.png")
    if headline:
        lines[lines.index("## Results per task"):lines.index("## Results per task")] = [
            "![metric vs epsilon, every task](leaderboard/headline.png)", ""]
    claims = check_claims(claim_inputs, suite.budgets, suite.tune_epsilon)
    lines += ["## The papers' headline claims against this table", ""]
    if suite.profile == "quick":
        lines += ["The quick profile trains a few steps with one seed: these verdicts exercise the checks, they "
                  "say nothing about the papers.", ""]
    lines += [f"- {sentence}" for sentence in claims] or ["- No claim can be checked from these cells."]
    lines.append("")
    lines += scale_section(figures / "frontier")
    path = docs / "leaderboard.md"
    path.write_text("\n".join(lines))
    return path
