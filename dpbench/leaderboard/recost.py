"""The leaderboard's "Costs re-measured on the current code" section: after a change to a method's code path, its
tasks' speed and memory measured again without re-running the suite (its tuning is what takes the hours).

`python -m dpbench.leaderboard --recost TASK[,TASK]` runs, for each variant of each named task, the test cell the suite
chose at the budget whose costs the report shows (its learning rate, clip norm and noise multiplier read from
docs/leaderboard/cells.csv: the suite's own cell), its first finished seed, each in a process of its own (the suite's
launcher), one at a time; a variant the suite finished no cell of (refused, failed) is listed with its reason, not run.
The figures go to docs/leaderboard/costs/TASK.json with the commit, date and machine, and the section beside the
cells' own columns. Speed is compared across methods within one record only (each row's step against DP-SGD's): the
cells' columns may come from another machine and ran two at a time.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from dpbench.core.errors import ConfigurationError
from dpbench.core.results import write_json_atomic
from dpbench.leaderboard.cells import read_outcome, run_cell
from dpbench.leaderboard.claims import fmt_number, fmt_ratio
from dpbench.leaderboard.launch import DEFAULT_LAUNCHER
from dpbench.leaderboard.provenance import current
from dpbench.leaderboard.scale import SECTION_TITLE as SCALE_TITLE
from dpbench.leaderboard.suite import Method, Suite, Task, Variant
from dpbench.leaderboard.summary import seconds_per_step
from dpbench.leaderboard.trial_cells import cell_for

SECTION_TITLE = "## Costs re-measured on the current code"
BASELINES = ("dpsgd", "dpadam")
"""The variant each row's step is compared with: the first of these the task runs."""
REASON_CHARS = 120


def commit() -> str:
    """The checkout's short commit, '-dirty' when files outside docs/ differ from it ('unknown' outside git): the
    records this writes under docs/ are not an edit of the code they measured."""
    code = current()
    return "unknown" if code.commit is None else code.commit[:7] + ("-dirty" if code.dirty else "")


def device_name() -> str:
    """The GPU's name, else the CPU's model name (Linux) with its core count."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    model = platform.processor() or "CPU"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        model = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                      if line.startswith("model name")), model)
    return f"{model}, {os.cpu_count()} cores"


def _chosen_rows(cells_csv: Path, task: str, epsilon: float) -> dict[str, list[dict[str, str]]]:
    """Each variant's test rows at the budget whose costs the report shows, or, where the task does not run it, at
    the lowest budget it ran (non-private methods: their only rows), as the report's cost columns choose."""
    if not cells_csv.exists():
        raise ConfigurationError(f"{cells_csv} does not exist: --recost reads the suite's chosen hyperparameters "
                                 "from it (run the suite, or --report-only from its cells, first)")
    by_budget: dict[str, dict[float | None, list[dict[str, str]]]] = {}
    with cells_csv.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row["task"] == task and row["phase"] == "test":
                budget = float(row["target_epsilon"]) if row["target_epsilon"] else None
                by_budget.setdefault(row["variant"], {}).setdefault(budget, []).append(row)
    if not by_budget:
        raise ConfigurationError(f"--recost {task}: {cells_csv} has no test cell of it (run the suite first)")
    return {variant: budgets.get(epsilon) or budgets[min(budgets, key=lambda b: -1.0 if b is None else b)]
            for variant, budgets in by_budget.items()}


def _measured(rows: list[dict[str, str]]) -> dict[str, str]:
    """The row a record re-measures: the first finished seed, else (the suite finished none) the first seed."""
    done = [row for row in rows if row["status"] == "done"]
    return min(done or rows, key=lambda row: int(row["seed"]))


def _optional(text: str) -> float | None:
    return float(text) if text else None


def _stale(record: dict[str, Any], chosen: dict[str, list[dict[str, str]]], epsilon: float) -> str | None:
    """Why a record no longer measures the report's choice (the suite re-chose a learning rate, clip norm or budget,
    calibrated another noise, finished a cell it had not, or ran other methods since), else None: its figures would
    otherwise sit beside cells they did not measure."""
    if record["epsilon"] != epsilon:
        return f"it measured the cells at epsilon {record['epsilon']:g}; the report's costs are at {epsilon:g}"
    measured = {row["variant"]: row for row in record["rows"]}
    if set(measured) != set(chosen):
        return "the report's methods differ from those it measured"
    for variant, rows in chosen.items():
        row, cell = measured[variant], _measured(rows)
        if (row["lr"], row["clip_norm"], row["epsilon"]) != (
                float(cell["lr"]), _optional(cell["clip_norm"]), _optional(cell["target_epsilon"])):
            return f"{row['label']}'s chosen learning rate, clip norm or budget changed since"
        if "suite_noise_multiplier" not in row:
            return "it was measured before records kept the suite cell's noise multiplier and status"
        suite_cell = (cell["status"], _optional(cell["noise_multiplier"]))
        if (row["suite_status"], row["suite_noise_multiplier"]) != suite_cell:
            return f"{row['label']}'s cell has another status or noise multiplier in the suite since"
    return None


def _median(rows: list[dict[str, str]], column: str) -> float | None:
    values = [float(row[column]) for row in rows if row["status"] == "done" and row[column]]
    return statistics.median(values) if values else None


def _measure(suite: Suite, task: Task, method: Method, variant: Variant, rows: list[dict[str, str]], root: Path,
             launcher: str, parameters: dict[str, Any] | None) -> dict[str, Any]:
    chosen = _measured(rows)
    epsilon = float(chosen["target_epsilon"]) if method.private else None
    suite_cell = {"variant": variant.name, "label": variant.label, "seed": int(chosen["seed"]), "epsilon": epsilon,
                  "lr": float(chosen["lr"]), "clip_norm": _optional(chosen["clip_norm"]) if method.private else None,
                  "suite_status": chosen["status"], "suite_noise_multiplier": _optional(chosen["noise_multiplier"])}
    if chosen["status"] != "done":  # the suite finished no such cell (e.g. an unreachable total): nothing to measure
        return {**suite_cell, "status": chosen["status"], "reason": chosen["reason"] or None, "cell": None}
    if method.private and not chosen["clip_norm"]:
        raise ConfigurationError(f"--recost {task.name}: the cells.csv row of {variant.name} (seed {chosen['seed']}) "
                                 "has no clip_norm, which a private method needs: regenerate cells.csv from the cells")
    noise = None
    if method.private and suite.total and task.noise_multiplier is None:  # the total's calibration, not the run's own
        noise = suite_cell["suite_noise_multiplier"]
        if noise is None:
            raise ConfigurationError(f"--recost {task.name}: the cells.csv row of {variant.name} (seed "
                                     f"{chosen['seed']}) has no noise_multiplier, which a total budget's cell runs "
                                     "at: regenerate cells.csv from the cells")
    cell = cell_for(suite, task, method, variant, "test", epsilon, suite_cell["seed"], None, suite_cell["lr"],
                    suite_cell["clip_norm"], noise)
    status = run_cell(cell, root, launcher=launcher, parameters=parameters)
    outcome = read_outcome(cell.directory(root))
    results = outcome.results if outcome is not None and outcome.results else {}
    return {**suite_cell, "status": status, "reason": outcome.reason if outcome else None,
            "samples_per_s": results.get("samples_per_s"),
            "s_per_step": seconds_per_step(results) if results else None,
            "peak_memory_mb": results.get("peak_memory_mb"), "memory_method": results.get("memory_method"),
            "test_value": outcome.value("test") if outcome else None,
            "cell": cell.directory(root).relative_to(root).as_posix()}


def remeasure(suite: Suite, names: list[str], docs: Path, root: Path, launcher: str = DEFAULT_LAUNCHER,
              parameters: dict[str, Any] | None = None) -> list[Path]:
    """Run each named task's chosen test cells again (the first finished seed of each) and write one record per task;
    returns their paths."""
    tasks = {task.name: task for task in suite.tasks}
    unknown = [name for name in names if name not in tasks]
    if unknown:
        raise ConfigurationError(f"--recost {','.join(unknown)}: not a task of the {suite.profile} profile "
                                 f"(its tasks: {', '.join(tasks)})")
    skipped = [f"{name}: {tasks[name].skip_reason()}" for name in names if tasks[name].skip_reason()]
    if skipped:
        raise ConfigurationError(f"--recost {'; '.join(skipped)}")
    measured, records = commit(), []
    for name in names:
        task = tasks[name]
        chosen = _chosen_rows(docs / "leaderboard" / "cells.csv", task.name, suite.tune_epsilon)
        started = datetime.now(timezone.utc)
        rows = [_measure(suite, task, method, variant, chosen[variant.name], root, launcher, parameters)
                for method in task.methods for variant in method.variants() if variant.name in chosen]
        record = {"task": name, "title": task.title, "commit": measured,
                  "started": started.isoformat(timespec="minutes"), "device": device_name(),
                  "epsilon": suite.tune_epsilon, "launcher": launcher, "rows": rows,
                  "load_average_at_end": [round(x, 2) for x in os.getloadavg()]}
        path = docs / "leaderboard" / "costs" / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, record)
        records.append(path)
    return records


def _short(reason: str) -> str:
    """A refusal's first clause (the task's table gives the whole), else the reason's start; no table separators."""
    clause = reason.split(": ")[0]
    text = clause if len(clause) >= 40 else reason
    if len(text) > REASON_CHARS:
        text = text[:REASON_CHARS].rsplit(" ", 1)[0] + " ..."
    return text.replace("|", "/")


def _label(row: dict[str, Any], epsilon: float) -> str:
    budget = row.get("epsilon")
    return row["label"] + (f" (at epsilon {budget:g})" if budget is not None and budget != epsilon else "")


def _peak_meaning(record: dict[str, Any]) -> str:
    """What the record's peak column measured, read from its runs (records from before runs named it measured the
    resident high-water mark)."""
    methods = {str(row.get("memory_method") or "") for row in record["rows"] if row["status"] == "done"}
    if methods and all(method.startswith("working set") for method in methods):
        return "peak: the working set, malloc's bytes in use at their peak"
    if methods and all("max_memory_reserved" in method for method in methods):
        return "peak: CUDA max_memory_reserved"
    if methods and all(methods):
        return "peak: measured differently by its runs (each cell's results.json names how)"
    return "peak: the resident high-water mark above the process's start"


def _record_lines(record: dict[str, Any], chosen: dict[str, list[dict[str, str]]]) -> list[str]:
    """The record's table; its "cells:" columns are the medians over seeds of the cells.csv rows it re-measured."""
    base = next((row for name in BASELINES for row in record["rows"] if row["variant"] == name), None)
    versus = f"step vs {base['label']}" if base else "step vs vanilla"
    load = record.get("load_average_at_end")
    lines = [f"### {record['title']}", "",
             f"`{record['task']}`: commit {record['commit']}, {record['started']}, {record['device']}"
             + (f" (load average 1/5/15 min at its end {load})" if load else "")
             + f"; each method's first seed at epsilon {record['epsilon']:g} unless its row says another (non-private: "
             f"its own run), launcher {record['launcher']}; {_peak_meaning(record)}.", "",
             f"| method | samples/s | s/step | {versus} | peak MB | cells: s/step | cells: {versus} | cells: peak MB |",
             "|---" * 8 + "|"]
    base_step = base.get("s_per_step") if base else None
    base_cells = _median(chosen[base["variant"]], "s_per_step") if base else None
    for row in record["rows"]:
        cells = chosen[row["variant"]]
        if row["status"] != "done":
            reason = _short(row.get("reason") or "")
            measured = f"{row['status']}{': ' + reason if reason else ''} | | |"
        else:
            measured = (f"{fmt_number(row['samples_per_s'], '.0f')} | {fmt_number(row['s_per_step'], '.3f')} | "
                        f"{fmt_ratio(row['s_per_step'], base_step)} | {fmt_number(row['peak_memory_mb'], '.0f')}")
        step = _median(cells, "s_per_step")
        lines.append(f"| {_label(row, record['epsilon'])} | {measured} | {fmt_number(step, '.3f')} | "
                     f"{fmt_ratio(step, base_cells)} | {fmt_number(_median(cells, 'peak_memory_mb'), '.0f')} |")
    return [*lines, ""]


def costs_section(costs_dir: Path, cells_csv: Path, tasks: list[str], epsilon: float) -> list[str]:
    """The records of the profile's tasks (`tasks`), in its order, at the budget whose costs the report shows
    (`epsilon`); a record that no longer measures the cells cells.csv names is listed as stale, without its
    figures."""
    records = {path.stem: json.loads(path.read_text()) for path in Path(costs_dir).glob("*.json")}
    records = {name: records[name] for name in tasks if name in records}
    if not records:
        return []
    lines = [SECTION_TITLE, "",
             "Each task's chosen test cells run again after a change to a method's code (`python -m "
             "dpbench.leaderboard --recost TASK`): the suite's own cell (its hyperparameters and noise), the first "
             "finished seed, one process at a time. The cells' columns (medians over seeds, run two at a time, "
             "perhaps on another machine) are shown beside; compare speeds across methods within a record (each "
             "step against DP-SGD's, or DP-Adam's where the task runs no DP-SGD), not across records.", ""]
    stale = []
    for name, record in records.items():
        try:
            chosen = _chosen_rows(cells_csv, name, epsilon)
        except ConfigurationError:
            stale.append(f"- `{name}` (commit {record['commit']}, {record['started']}): cells.csv has no test cell of "
                         "this task")
            continue
        reason = _stale(record, chosen, epsilon)
        if reason is None:
            lines += _record_lines(record, chosen)
        else:
            stale.append(f"- `{name}` (commit {record['commit']}, {record['started']}): {reason}; run "
                         f"`python -m dpbench.leaderboard --recost {name}`")
    if stale:
        lines += ["Records that no longer measure this report's cells (not shown):", "", *stale, ""]
    return lines


def rewrite(docs: Path, tasks: list[str], epsilon: float) -> Path:
    """Replace the section in docs/leaderboard.md (or insert it before the claims at scale, else at the end), leaving
    every other section as it is; `tasks`: the profile's, in its order; `epsilon`: the budget its costs are at."""
    path = docs / "leaderboard.md"
    text = path.read_text()
    start = text.find("\n" + SECTION_TITLE)
    if start >= 0:
        end = text.find("\n## ", start + 1)
        head, tail = text[:start], text[end:] if end >= 0 else ""
    else:
        scale_at = text.find("\n" + SCALE_TITLE)
        head, tail = (text[:scale_at], text[scale_at:]) if scale_at >= 0 else (text, "")
    section = costs_section(docs / "leaderboard" / "costs", docs / "leaderboard" / "cells.csv", tasks, epsilon)
    body = "\n".join(section) + "\n" if section else ""
    path.write_text(head.rstrip("\n") + "\n\n" + body + tail.lstrip("\n"))
    return path
