"""The leaderboard's machinery end to end on a tiny suite: real dpbench runs, a refusal, resume, the report."""

import contextlib
import csv
import json
import logging
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from dpbench.core.errors import ConfigurationError
from dpbench.core.results import write_json_atomic
from dpbench.leaderboard import Scheduler, build, load_suite
from dpbench.leaderboard.cell_order import choose
from dpbench.leaderboard.cells import STOPPED_REASON, Cell, read_outcome, run_cell
from dpbench.leaderboard.claims import fmt_value
from dpbench.leaderboard.launch import LAUNCHERS
from dpbench.leaderboard.plots import front_levels, pareto
from dpbench.leaderboard.provenance import current
from dpbench.leaderboard.suite import _labelled
from dpbench.leaderboard.trial_cells import start_grid
from tests.helpers.leaderboard_suites import TINY

ENV = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def _suite(tmp_path: Path, text: str = TINY, profile: str = "tiny"):
    path = tmp_path / "suite.yaml"
    path.write_text(text)
    return load_suite(profile, path)


def _results_files(root: Path) -> dict[Path, int]:
    return {path: path.stat().st_mtime_ns for path in root.rglob("*.json") if path.name in ("results.json",
                                                                                            "refused.json")}


def test_tiny_suite_end_to_end_with_refusal_resume_and_report(tmp_path, caplog):
    suite = _suite(tmp_path)
    root, docs = tmp_path / "cells", tmp_path / "docs"
    Scheduler(suite, root, ENV).run()

    done = {"cnn/nonprivate/tune_nonprivate_t0", "cnn/nonprivate/nonprivate_s0", "cnn/dpsgd/tune_eps1_t0",
            "cnn/dpsgd/eps1_s0", "vit/dpsgd/tune_eps1_t0", "vit/dpsgd/eps1_s0"}
    for name in done:
        assert (root / name / "results.json").exists(), (root / name / "cell.log").read_text()
    refused = read_outcome(root / "vit/jl_r1/tune_eps1_t0")
    assert refused.status == "refused" and "unreachable" in refused.reason
    assert read_outcome(root / "vit/jl_r1/eps1_s0").status == "refused"  # shown per budget, with the reason
    assert not (root / "absent").exists()
    tune = json.loads((root / "cnn/dpsgd/tune_eps1_t0/results.json").read_text())
    assert tune["validation_size"] == 200 and tune["validation_accuracy"] is not None
    final = json.loads((root / "cnn/dpsgd/eps1_s0/results.json").read_text())
    assert final["validation_size"] == 0 and final["target_epsilon"] == 1.0
    code = current()  # every cell records the checkout it ran from
    cell = json.loads((root / "cnn/dpsgd/eps1_s0/cell.json").read_text())
    assert len(code.commit) == 40 and (cell["commit"], cell["dirty"]) == (code.commit, code.dirty)
    assert final["config"]["optimizer"]["lr"] == tune["config"]["optimizer"]["lr"]
    assert final["delta"] == 1e-5  # the suite's delta, and a task's own where it sets one
    assert json.loads((root / "vit/dpsgd/eps1_s0/results.json").read_text())["delta"] == 1e-6

    # Resume: only the deleted cell runs again; the refused rung is not retried.
    before = _results_files(root)
    removed = root / "cnn/dpsgd/eps1_s0"
    for path in sorted(removed.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    removed.rmdir()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="dpbench.leaderboard.cell_order"):
        Scheduler(suite, root, ENV).run()
    logged = [record.getMessage().split()[-1] for record in caplog.records if record.getMessage().startswith("done")]
    assert logged == ["cnn/dpsgd/eps1_s0"]  # the recorded cells are not news: only the cell that ran is logged
    after = _results_files(root)
    assert set(after) == set(before)
    changed = {path.parent.relative_to(root).as_posix() for path in after if after[path] != before[path]}
    assert changed == {"cnn/dpsgd/eps1_s0"}

    # A cell of a method the suite no longer names (an edited suite) stays on disk but out of the report.
    dropped = root / "cnn/dropped/eps1_s0"
    shutil.copytree(root / "cnn/dpsgd/eps1_s0", dropped)
    record = json.loads((dropped / "cell.json").read_text())
    (dropped / "cell.json").write_text(json.dumps({**record, "method": "dropped", "variant": "dropped"}))

    markdown = build(suite, root, docs, "pytest", allow_mixed_commits=True).read_text()
    assert ("Mixed commits, allowed by `--allow-mixed-commits`" in markdown) == code.dirty
    rows = list(csv.DictReader((docs / "leaderboard" / "cells.csv").open()))
    assert len(rows) == 8 and "left out: 1 cell(s) of methods, rungs or budgets the suite no longer runs" in markdown
    for row in rows:
        if row["status"] == "done":
            results = json.loads((root / row["cell"] / "results.json").read_text())
            shown = "" if row["phase"] == "tune" else str(results["test_accuracy"])  # no trial's test value
            assert row["test_value"] == shown and row["commit"] == code.commit
            peak = results["peak_memory_mb"]
            assert row["peak_memory_mb"] == ("" if peak is None else str(peak))
    rerun = json.loads((root / "cnn/dpsgd/eps1_s0/results.json").read_text())
    nonprivate = json.loads((root / "cnn/nonprivate/nonprivate_s0/results.json").read_text())
    table = [line for line in markdown.splitlines() if line.startswith("| DP-SGD |")]
    assert fmt_value(rerun["test_accuracy"], "accuracy") in table[0]
    assert any(fmt_value(nonprivate["test_accuracy"], "accuracy") in line for line in markdown.splitlines()
               if line.startswith("| non-private |"))
    assert "| JL (r=1) |" in markdown and "refused at epsilon 1: " + refused.reason in markdown
    cnn_section = markdown.split("### tiny CNN")[1].split("###")[0]
    assert "Three steps only, so the numbers say nothing." in cnn_section
    assert "; delta 1e-05 (1e-06 for vit), each below 1/N, N the task's training-set size" in markdown
    assert "does not count the tuning" in markdown and "/nonexistent/fashion-mnist does not exist" in markdown
    assert (docs / "leaderboard" / "headline.png").exists()
    assert "not reached yet" not in markdown

    assert list((docs / "leaderboard").glob("vit_*.png"))
    shutil.move(root / "vit", tmp_path / "vit")  # a suite stopped before its second task
    markdown = build(suite, root, docs, "pytest", allow_mixed_commits=True).read_text()
    waiting = markdown.split("Tasks the suite has not reached yet")[1].split("\n\n")[1]
    assert waiting == "- tiny ViT (`vit`)"
    assert not list((docs / "leaderboard").glob("vit_*.png"))  # no figure left from the earlier report


def test_every_method_searches_the_same_grid_and_non_private_as_many_learning_rates(tmp_path):
    grid = "tuning: {lr_points: 3, clip_points: 3, max_growth: 4, each_budget: true}"
    suite = _suite(tmp_path, TINY.replace("tuning: {lr_points: 1, clip_points: 1, max_growth: 1, each_budget: false}",
                                          grid).replace("cnn: {methods: [nonprivate, dpsgd]}",
                                                        "cnn: {methods: [nonprivate, dpsgd, jl]}"))
    cnn = suite.tasks[0]
    nonprivate, dpsgd, jl = cnn.methods
    private = start_grid(suite, cnn, dpsgd).points()
    assert private == start_grid(suite, cnn, jl).points() and len(private) == 9 == suite.trials
    assert sorted({lr for lr, _ in private}) == [0.5, 1.0, 2.0] and sorted({c for _, c in private}) == [0.5, 1.0, 2.0]
    public = start_grid(suite, cnn, nonprivate).points()
    assert len(public) == 9 and {c for _, c in public} == {None}
    assert public[0][0] == 0.5 and public[-1][0] == 2.0  # the same range, as finely


def test_every_rung_shown_is_tuned_with_the_same_trials_and_tested_with_its_own_choice(tmp_path):
    """JL at few projections trains to chance: a choice made there would be noise for the larger rung."""
    text = TINY.replace("values: [1], keep: 1", "values: [1, 2, 10], keep: 2").replace("lr_points: 1", "lr_points: 2")
    suite = _suite(tmp_path, text)
    vit = suite.tasks[1]
    jl = vit.methods[1]

    class Outcomes(Scheduler):
        """r = 1 is refused; every finished trial scores its lr times its rung (r = 10's best is trial 0)."""

        def _run(self, cell):
            self.planned.append(cell)
            if cell.variant == "jl_r1":
                return "refused"
            directory = cell.directory(self.root)
            directory.mkdir(parents=True)
            rung = int(cell.variant.split("_r")[1])
            score = cell.lr * rung if rung == 2 else 1 / cell.lr
            write_json_atomic(directory / "cell.json", {**cell.__dict__})
            write_json_atomic(directory / "results.json", {"test_metric": "accuracy", "validation_accuracy": score})
            return "done"

    scheduler = Outcomes(suite, tmp_path / "cells")
    scheduler.run_method(vit, jl)
    tunes = {(c.variant, c.trial): (c.lr, c.clip_norm) for c in scheduler.planned if c.phase == "tune"}
    points = start_grid(suite, vit, jl).points()
    assert tunes == {("jl_r1", 0): points[0], ("jl_r2", 0): points[0], ("jl_r2", 1): points[1],
                     ("jl_r10", 0): points[0], ("jl_r10", 1): points[1]}  # r = 1 refused at its first trial
    best = {"jl_r2": max(points, key=lambda p: p[0]), "jl_r10": min(points, key=lambda p: p[0])}
    tests = [c for c in scheduler.planned if c.phase == "test"]
    assert {c.variant for c in tests} == {"jl_r1", "jl_r2", "jl_r10"}
    for cell in tests:
        if cell.variant != "jl_r1":
            assert (cell.lr, cell.clip_norm) == best[cell.variant], cell.variant


def test_a_method_whose_trials_all_failed_runs_no_test_cell(tmp_path):
    suite = _suite(tmp_path)
    cnn = suite.tasks[0]

    class Failing(Scheduler):
        def _run(self, cell):
            self.planned.append(cell)
            return "failed"

    scheduler = Failing(suite, tmp_path / "cells")
    scheduler.run_method(cnn, cnn.methods[1])
    assert [c.phase for c in scheduler.planned] == ["tune"]  # trial 0 failed: nothing to test


def test_choice_is_the_best_validation_trial_and_loss_is_minimised(tmp_path):
    def trial(k: int, value: float, metric: str) -> Cell:
        cell = Cell("t", "m", "m", "m", "tune", 3.0, 0, k, lr=0.1 * (k + 1), clip_norm=1.0)
        directory = cell.directory(tmp_path / metric)
        directory.mkdir(parents=True)
        write_json_atomic(directory / "cell.json", {**cell.__dict__})
        write_json_atomic(directory / "results.json", {"test_metric": metric, f"validation_{metric}": value})
        return cell

    accuracy = [trial(k, v, "accuracy") for k, v in enumerate([0.5, 0.9, 0.7])]
    loss = [trial(k, v, "loss") for k, v in enumerate([3.0, 2.0, 2.5])]
    assert choose(accuracy, tmp_path / "accuracy").trial == 1
    assert choose(loss, tmp_path / "loss").trial == 1


def test_pareto_front_keeps_only_undominated_points_beyond_the_measurement_spread():
    points = [(100.0, 0.9, "a", 0.0), (50.0, 0.8, "b", 0.0), (60.0, 0.7, "c", 0.0), (200.0, 0.95, "d", 0.0)]
    assert [p[2] for p in pareto(points, maximize=True)] == ["b", "a", "d"]
    loss = [(1.0, 3.0, "x", 0.0), (2.0, 2.0, "y", 0.0), (3.0, 2.5, "z", 0.0)]
    assert [p[2] for p in pareto(loss, maximize=False)] == ["x", "y"]
    # c costs 10 MB more than b but the cost moves by 12 MB between seeds: b does not dominate it.
    noisy = [(50.0, 0.8, "b", 12.0), (60.0, 0.7, "c", 0.0)]
    assert [p[2] for p in pareto(noisy, maximize=True)] == ["b", "c"]
    # the staircase never drops below a point it passed: c is on the front within b's spread, but b is better
    assert front_levels(pareto(noisy, maximize=True), maximize=True) == [0.8, 0.8]
    assert front_levels(pareto(loss, maximize=False), maximize=False) == [3.0, 2.0]
    # d costs more than a and is better only within their intervals: a dominates it (the review's JL r = 10 vs DP2)
    overlapping = [(100.0, 0.714, "a", 0.0, (0.685, 0.743)), (250.0, 0.759, "d", 0.0, (0.726, 0.792))]
    assert [p[2] for p in pareto(overlapping, maximize=True)] == ["a"]
    apart = [(100.0, 0.714, "a", 0.0, (0.70, 0.73)), (250.0, 0.759, "d", 0.0, (0.74, 0.78))]
    assert [p[2] for p in pareto(apart, maximize=True)] == ["a", "d"]


def test_suite_naming_an_unknown_method_is_refused(tmp_path):
    with pytest.raises(ConfigurationError, match="unknown methods"):
        _suite(tmp_path, TINY.replace("methods: [nonprivate, dpsgd]}", "methods: [nonprivate, dpsgdd]}"))


def test_run_cell_records_outcomes_and_reruns_only_failed_or_edited_cells(tmp_path, monkeypatch):
    calls = []

    def fake(args: list[str], log: Path, env) -> int:
        """Stands in for the CLI: exit 2 with dpbench's error line, a crash, or a results.json."""
        calls.append(args)
        run_dir = Path(next(a for a in args if a.startswith("hydra.run.dir=")).split("=", 1)[1])
        if "refuse" in args:
            log.write_text("noise\ndpbench: error: epsilon=1 is unreachable: raise r\n")
            return 2
        if "crash" in args and len(calls) == 1:
            log.write_text("Traceback ...\nRuntimeError: boom\n")
            return 1
        write_json_atomic(run_dir / "results.json", {"test_metric": "accuracy", "test_accuracy": 0.5})
        log.write_text("ok\n")
        return 0

    monkeypatch.setitem(LAUNCHERS, "fake", fake)

    def cell(*overrides: str) -> Cell:
        return Cell("t", "m", "m", "m", "test", 1.0, 0, None, 0.1, 1.0, overrides=list(overrides))

    assert run_cell(cell("crash"), tmp_path, launcher="fake") == "failed"
    assert read_outcome(cell("crash").directory(tmp_path)).reason == "RuntimeError: boom"
    assert run_cell(cell("crash"), tmp_path, launcher="fake") == "done"  # a failure is retried
    assert run_cell(cell("crash"), tmp_path, launcher="fake") == "done" and len(calls) == 2  # a result is kept
    assert run_cell(cell("edited"), tmp_path, launcher="fake") == "done" and len(calls) == 3  # an edited cell reruns
    refused = Cell("t", "m", "m", "m", "test", 3.0, 0, None, 0.1, 1.0, overrides=["refuse"])
    assert run_cell(refused, tmp_path, launcher="fake") == "refused"
    assert run_cell(refused, tmp_path, launcher="fake") == "refused" and len(calls) == 4  # a refusal is kept
    assert read_outcome(refused.directory(tmp_path)).reason == "epsilon=1 is unreachable: raise r"


def _holders(path: Path) -> list[int]:
    """Processes that hold `path` open (Linux /proc)."""
    holders = []
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        try:
            if Path(os.readlink(fd)) == path:
                holders.append(int(fd.parts[2]))
        except OSError:
            continue
    return holders


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="reads /proc")
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_stopped_suite_stops_its_running_cells_and_the_next_invocation_reruns_them(tmp_path, jobs):
    """SIGTERM (a time limit, `kill`) to the leaderboard: exit 143 and no cell left training behind its back, also
    with two pipelines running at once."""
    import signal
    import subprocess
    import sys
    import time

    suite = tmp_path / "suite.yaml"
    suite.write_text(TINY.replace("batch_size=100, max_steps=3]", "batch_size=100, max_steps=100000]", 1))
    root = tmp_path / "cells"
    command = [sys.executable, "-m", "dpbench.leaderboard", "--suite", str(suite), "--profile", "tiny", "--root",
               str(root), "--docs", str(tmp_path / "docs"), "--jobs", jobs]
    leaderboard = subprocess.Popen(command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True)
    logs = [root / "cnn/nonprivate/tune_nonprivate_t0/cell.log", root / "cnn/dpsgd/tune_eps1_t0/cell.log"][:int(jobs)]
    try:
        deadline = time.monotonic() + 240
        started = [log.parent / "dpbench.log" for log in logs]  # Lightning's lines, logged as the trainer starts
        while not all("TPU available" in (path.read_text() if path.exists() else "") for path in started):
            assert leaderboard.poll() is None, leaderboard.communicate()
            assert time.monotonic() < deadline, "the cells did not start"
            time.sleep(0.5)
        time.sleep(2)  # into training
        assert all(_holders(log.resolve()) for log in logs), "the cells are not running"
        leaderboard.send_signal(signal.SIGTERM)
        _, stderr = leaderboard.communicate(timeout=60)
        assert leaderboard.returncode == 143, stderr
        assert "run the same command again to continue" in stderr
        deadline = time.monotonic() + 30
        while any(_holders(log.resolve()) for log in logs) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_holders(log.resolve()) for log in logs), "a cell went on training after the suite stopped"
        outcomes = [read_outcome(log.parent) for log in logs]
        assert all(outcome.status not in ("done", "refused") for outcome in outcomes)  # to be run again
        assert all(outcome.reason == STOPPED_REASON for outcome in outcomes if outcome.status == "failed")
        assert {log.parent for log in root.rglob("cell.log")} == {log.parent for log in logs}  # no cell started after
        invocation = json.loads((root / "suite_runs.json").read_text())[-1]
        assert invocation["stopped"] and invocation["wall_s"] > 2  # a suite spread over sessions counts every part
    finally:  # a failing run must not leave the suite or its cells behind, even a suite that exited
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leaderboard.pid, signal.SIGKILL)


def test_submitit_launcher_runs_each_cell_as_a_job(tmp_path, clean_commit):
    """--launcher submitit --jobs 2: each cell a submitit job (a local process where there is no SLURM), every cell
    an ordinary run with its results."""
    pytest.importorskip("submitit")
    from dpbench.leaderboard.__main__ import main

    suite = tmp_path / "suite.yaml"
    suite.write_text(TINY.replace("vit: {methods: [dpsgd, jl]}", "vit: {methods: []}"))
    root = tmp_path / "cells"
    code = main(["--suite", str(suite), "--profile", "tiny", "--root", str(root), "--docs", str(tmp_path / "docs"),
                 "--launcher", "submitit", "--jobs", "2", "--submitit", "timeout_min=10"])
    assert code == 0
    for name in ("cnn/nonprivate/tune_nonprivate_t0", "cnn/nonprivate/nonprivate_s0", "cnn/dpsgd/tune_eps1_t0",
                 "cnn/dpsgd/eps1_s0"):
        outcome = read_outcome(root / name)
        assert outcome.status == "done", (root / name / "cell.log").read_text()[-2000:]
        assert outcome.cell["launcher"] == "submitit" and (root / name / "submitit").is_dir()


@pytest.mark.parametrize(("argv", "message"), [
    (["--submitit", "timeout_min"], "write KEY=VALUE"),
    (["--launcher", "fork", "--submitit", "timeout_min=5"], "need --launcher submitit"),
    (["--launcher", "submitit", "--submitit", "timeout_min=1.5"], "timeout_min=1.5"),
    (["--launcher", "submitit", "--submitit", "no_such_parameter=1"], "no_such_parameter"),
])
def test_bad_launcher_options_are_refused_in_one_line(tmp_path, capsys, argv, message):
    from dpbench.leaderboard.__main__ import main

    suite = tmp_path / "suite.yaml"
    suite.write_text(TINY)
    if "submitit" in argv:
        pytest.importorskip("submitit")
    assert main(["--suite", str(suite), "--profile", "tiny", "--root", str(tmp_path / "cells"), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "cells").exists()


def test_a_dry_run_on_a_fresh_root_says_it_cannot_estimate_the_time(tmp_path, capsys):
    from dpbench.leaderboard.__main__ import main

    suite = tmp_path / "suite.yaml"
    suite.write_text(TINY)
    assert main(["--suite", str(suite), "--profile", "tiny", "--root", str(tmp_path / "cells"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "no task has a finished cell yet, so there is no time to estimate from" in out and "0.0 h" not in out


def test_jobs_below_one_is_a_usage_error(capsys):
    from dpbench.leaderboard.__main__ import main

    with pytest.raises(SystemExit) as stop:
        main(["--jobs", "0", "--dry-run"])
    assert stop.value.code == 2 and "must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("profile", ["full", "quick"])
def test_every_cell_of_the_shipped_suite_composes_into_a_valid_config(profile, compose):
    """A typo in conf/leaderboard/suite.yaml would otherwise surface hours into a run, as one cell's failure."""
    from omegaconf import OmegaConf

    from dpbench.core.config import Config, validated
    from dpbench.data import DATASETS
    from dpbench.leaderboard.cell_order import cell_for
    from dpbench.models import MODELS
    from dpbench.privatizers import STRATEGIES

    suite = load_suite(profile)
    composed = 0
    for task in suite.tasks:
        for method in task.methods:
            lr, clip = start_grid(suite, task, method).points()[0]
            for variant in method.variants():
                cell = cell_for(suite, task, method, variant, "tune", suite.tune_epsilon, 0, 0, lr, clip)
                cfg = compose(cell.overrides)
                validated(Config, cfg, "top-level")
                model, data, privatizer = (OmegaConf.to_container(node, resolve=True)
                                           for node in (cfg.model, cfg.data, cfg.privatizer))
                assert data.pop("validation_size") == task.validation_size  # load_data carves it, any data set
                for registry, node in ((MODELS, model), (DATASETS, data), (STRATEGIES, privatizer)):
                    found, settings = registry.resolve(node)
                    validated(found.schema, settings, registry.group)
                assert cfg.optimizer.name == task.optimizer_of(method) and cfg.optimizer.lr == lr
                composed += 1
    assert composed >= sum(len(task.methods) for task in suite.tasks)


def test_every_method_is_labelled_with_the_optimizer_it_runs_with():
    """`optimizer: task` runs JL and the non-private baseline with each task's optimizer: the label says which."""
    labels = {task.name: [variant.label for method in task.methods for variant in method.variants()]
              for task in load_suite("full").tasks}
    assert "non-private SGD" in labels["cnn_mnist5k"] and "non-private Adam" in labels["vit_mnist5k"]
    assert "DP-SGD-JL (r=10)" in labels["cnn_mnist5k"] and "DP-Adam" in labels["vit_mnist5k"]
    jl = next(method for method in load_suite("full").tasks[0].methods if method.name == "jl")
    assert "DP-Adam-JL (r=10)" in [variant.label for variant in _labelled(replace(jl, label=""), "adam").variants()]
    assert "sparse DP-Adam" in labels["word2vec_bbc_news"] and "D2P-SGD (no projection)" in labels["cnn_mnist5k"]
