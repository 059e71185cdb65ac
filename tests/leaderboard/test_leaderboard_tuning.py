"""The leaderboard's tuning grid: the same points for every method, grown past an edge until the optimum is interior
(or the documented limit), tuned at each budget; and the report and figures built from its cells."""

import shutil
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image

from dpbench.core.errors import ConfigurationError
from dpbench.core.results import write_json_atomic
from dpbench.leaderboard import Scheduler, build, load_suite
from dpbench.leaderboard.cells import Outcome
from dpbench.leaderboard.grid import GridSpec, TuningGrid, optimum_status
from dpbench.leaderboard.plots import cost_plot
from dpbench.leaderboard.remaining import remaining
from dpbench.leaderboard.summary import Entry, summarize

SUITE = """
delta: 1.0e-5
common: []
methods:
  nonprivate: {label: non-private, overrides: [privatizer=nonprivate], optimizer: task, private: false}
  dpsgd: {label: DP-SGD, overrides: [privatizer=vanilla], optimizer: sgd}
  d2p2: {label: D2P2-SGD, overrides: [privatizer=d2p2], optimizer: sgd}
tasks:
  cnn:
    title: CNN (26K)
    overrides: [model=cnn, data=mnist5k]
    optimizer: sgd
    lr: {sgd: [0.5, 2.0]}
    clip: [0.5, 2.0]
    validation_size: 200
    anchors:
      - {method: dpsgd, epsilon: 3, value: 0.9, paper: Somebody et al. 2021, where: Table 1, setting: "the same CNN"}
  lstm:
    title: BiLSTM (587K)
    overrides: [model=lstm, data=rotten_tomatoes]
    optimizer: sgd
    lr: {sgd: [0.5, 2.0]}
    clip: [0.5, 2.0]
    validation_size: 200
    cost_only: true
    note: Nothing learns here.
profiles:
  p:
    budgets: [1, 3]
    tune_epsilon: 3
    tuning: {lr_points: 3, clip_points: 3, max_growth: 16, each_budget: true}
    tuning_seed: 3
    seeds: [0, 1, 2]
    smoke: true
    tasks:
      cnn: {methods: [nonprivate, dpsgd, d2p2]}
      lstm: {methods: [dpsgd]}
"""


CLEAN = {"commit": "a" * 40, "dirty": False}
"""One clean commit for every simulated cell: the report's provenance check passes them."""


def _suite(tmp_path: Path, text: str = SUITE):
    path = tmp_path / "suite.yaml"
    path.write_text(text)
    return load_suite("p", path)


def score(cell) -> float:
    """Validation accuracy peaking at lr 8 (outside the first range [0.5, 2]) and clip 1, better at larger epsilon;
    D2P2 a point better than DP-SGD at every seed; seeds differ by a fixed offset."""
    lr_term = -abs(np.log2(cell.lr / 8.0)) * 0.05
    clip_term = 0.0 if cell.clip_norm is None else -abs(np.log2(cell.clip_norm)) * 0.05
    epsilon_term = 0.0 if cell.epsilon is None else 0.02 * cell.epsilon
    method_term = 0.01 if cell.method == "d2p2" else 0.0
    return 0.7 + lr_term + clip_term + epsilon_term + method_term + 0.003 * cell.seed


class Simulated(Scheduler):
    """Writes each cell's outcome from `score` instead of training: the search's logic, not the models, is tested."""

    def _run(self, cell):
        self.planned.append(cell)
        directory = cell.directory(self.root)
        directory.mkdir(parents=True, exist_ok=True)
        write_json_atomic(directory / "cell.json", {**cell.__dict__, "process_wall_s": 1.0, **CLEAN})
        value = score(cell)
        results = {"test_metric": "accuracy", "device": "cpu", "epsilon": cell.epsilon, "train_time_s": 10.0,
                   "steps": 100, "step_time_s": 0.1, "samples_per_s": 500.0 if cell.method == "d2p2" else 800.0,
                   "peak_memory_mb": 100.0 + 5 * cell.seed}
        results["validation_accuracy" if cell.phase == "tune" else "test_accuracy"] = value
        write_json_atomic(directory / "results.json", results)
        return "done"


def test_the_grid_grows_past_an_edge_until_the_optimum_is_interior(tmp_path):
    suite = _suite(tmp_path)
    scheduler = Simulated(suite, tmp_path / "cells")
    cnn = suite.tasks[0]
    scheduler.run_method(cnn, cnn.methods[1])
    for epsilon in (1, 3):  # tuned at each budget, each with its own search
        trials = [c for c in scheduler.planned if c.phase == "tune" and c.epsilon == epsilon]
        lrs = sorted({c.lr for c in trials})
        assert lrs == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0]  # grown three steps up: 8 is interior
        assert sorted({c.clip_norm for c in trials}) == [0.5, 1.0, 2.0]  # clip 1 was interior from the start
        assert len(trials) == 18 and [c.trial for c in trials] == list(range(18))
        tests = [c for c in scheduler.planned if c.phase == "test" and c.epsilon == epsilon]
        assert {(c.lr, c.clip_norm) for c in tests} == {(8.0, 1.0)} and sorted(c.seed for c in tests) == [0, 1, 2]
    finished = [(c.lr, c.clip_norm, score(c)) for c in scheduler.planned if c.phase == "tune" and c.epsilon == 3]
    assert optimum_status(finished, (0.5, 2.0), (0.5, 2.0), suite.tuning, True) == "interior after growing the range"


def test_the_search_stops_at_its_limit_and_says_so(tmp_path):
    suite = _suite(tmp_path, SUITE.replace("max_growth: 16", "max_growth: 2"))
    scheduler = Simulated(suite, tmp_path / "cells")
    cnn = suite.tasks[0]
    scheduler.run_method(cnn, cnn.methods[1])
    trials = [c for c in scheduler.planned if c.phase == "tune" and c.epsilon == 3]
    assert sorted({c.lr for c in trials}) == [0.5, 1.0, 2.0, 4.0]  # 8 would pass 2 x 2.0
    status = optimum_status([(c.lr, c.clip_norm, score(c)) for c in trials], (0.5, 2.0), (0.5, 2.0), suite.tuning,
                            True)
    assert status == "on the edge of the grid (lr) at the search's limit"


def test_a_diverged_trial_past_the_edge_makes_the_optimum_interior():
    grid = TuningGrid.start((0.5, 2.0), None, GridSpec(3, 1, 16, True))
    assert grid.lr.values == [0.5, 1.0, 2.0] and grid.extend((2.0, None))
    assert grid.lr.values[-1] == 4.0
    trials = [(0.5, None, 0.5), (1.0, None, 0.6), (2.0, None, 0.7), (4.0, None, None)]  # lr 4 diverged
    assert optimum_status(trials, (0.5, 2.0), None, GridSpec(3, 1, 16, True), True) == (
        "interior after growing the range")
    interior = [(0.5, None, 0.5), (1.0, None, 0.8), (2.0, None, 0.7)]
    assert optimum_status(interior, (0.5, 2.0), None, GridSpec(3, 1, 16, True), True) == "interior on the first range"


def test_an_edge_optimum_of_clipped_sgd_says_whether_its_step_size_is_bracketed():
    """On a 3 x 3 grid an edge point other than the two extreme corners has trials of smaller and larger lr x clip;
    the extreme corners have none on one side, and a method whose step is not lr x clip (Adam) is not told so."""
    spec, lrs, clips = GridSpec(3, 3, 1, False), (0.25, 1.0, 4.0), (0.5, 1.0, 2.0)

    def status(best: tuple[float, float], step_is_product: bool = True) -> str:
        trials = [(lr, clip, 0.9 if (lr, clip) == best else 0.5) for lr in lrs for clip in clips]
        return optimum_status(trials, (0.25, 4.0), (0.5, 2.0), spec, True, step_is_product=step_is_product)

    assert status((4.0, 0.5)) == "on the edge of the grid (lr and clip) at the search's limit; lr x clip bracketed"
    assert status((1.0, 2.0)) == "on the edge of the grid (clip) at the search's limit; lr x clip bracketed"
    assert status((4.0, 2.0)) == "on the edge of the grid (lr and clip) at the search's limit"  # the largest step
    assert status((0.25, 0.5)) == "on the edge of the grid (lr and clip) at the search's limit"  # the smallest
    assert status((4.0, 0.5), step_is_product=False) == "on the edge of the grid (lr and clip) at the search's limit"
    assert status((1.0, 1.0)) == "interior on the first range"


def test_bad_tuning_blocks_are_refused(tmp_path):
    with pytest.raises(ConfigurationError, match="unknown keys"):
        _suite(tmp_path, SUITE.replace("each_budget: true", "each_budget: true, trails: 3"))
    with pytest.raises(ConfigurationError, match="lacks 'each_budget'"):
        _suite(tmp_path, SUITE.replace(", each_budget: true", ""))
    with pytest.raises(ConfigurationError, match="lacks"):
        _suite(tmp_path, SUITE.replace("where: Table 1, ", ""))


def test_report_glance_anchors_tuning_counts_and_cost_only_section(tmp_path):
    suite = _suite(tmp_path)
    root, docs = tmp_path / "cells", tmp_path / "docs"
    Simulated(suite, root).run()
    markdown = build(suite, root, docs, "pytest").read_text()
    glance = markdown.split("## At a glance")[1].split("## Results per task")[0]
    # D2P2 wins by exactly one point at every seed: a zero-width interval, "holds".
    assert ("| CNN (26K) | 3 | D2P2-SGD 77.3% [76.6, 78.0] | DP-SGD | +1.0 points [+1.0, +1.0] over 3 paired seeds, "
            "p < 0.001, Holm < 0.001 | holds | 1.00x memory, 1.00x time |") in glance
    assert "Published figures this task reproduces:" in markdown
    assert ("- Somebody et al. 2021, Table 1: the same CNN: 90.0% at epsilon 3; DP-SGD here 76.3% [75.6, 77.0], -13.7 "
            "points") in markdown
    assert "- non-private: 18 trials (18 finished), best lr 8.02 -> 70.9%, interior after growing the range" in markdown
    assert "published 90.0% (Somebody et al. 2021, Table 1: the same CNN)" in markdown  # beside the cell too
    assert ("Tuning (validation accuracy, seed 3): 5 searches, 0 with the optimum interior on the first range, 5 "
            "interior after growing it, 0 on the edge") in markdown
    cost_only = markdown.split("## Cost only")[1].split("## The papers'")[0]
    assert "Nothing learns here." in cost_only and "| DP-SGD | 800 |" in cost_only
    assert "BiLSTM" not in glance and "BiLSTM" not in markdown.split("## The papers'")[1].split("## Claims")[0]
    assert "D2P2 (better than DP-SGD, especially at small epsilon), CNN (26K), on CPU" in markdown
    # one evaluation seed of a private method not yet run: that budget's row is provisional, the others are not
    (unrun,) = [path for path in root.glob("*/d2p2/eps3_s*") if path.name.endswith(str(max(suite.seeds)))]
    shutil.rmtree(unrun)
    glance = build(suite, root, docs, "pytest").read_text().split("## At a glance")[1].split("## Results")[0]
    rows = [row for row in glance.splitlines() if row.startswith("| CNN (26K) |")]
    assert [" | provisional: " in row for row in rows] == [row.startswith("| CNN (26K) | 3 |") for row in rows]


def test_a_cost_figure_renders_to_a_non_blank_png(tmp_path):
    def measured(method: str, label: str, peak: list[float], accuracy: float) -> Entry:
        return Entry("t", method, method, label, 3, metric="accuracy",
                     by_seed={0: accuracy - 0.01, 1: accuracy, 2: accuracy + 0.01}, peak_mb=peak,
                     step_s=[0.1, 0.11, 0.12])

    entries = [measured("dpsgd", "DP-SGD", [200, 204, 202], 0.9), measured("grape", "DP-GRAPE", [120, 121, 119], 0.88),
               measured("jl", "JL (r=10)", [300, 305, 310], 0.91)]
    path = cost_plot(entries, 3, "CNN (26K) on MNIST-5k", tmp_path / "cost.png")
    assert path.stat().st_size > 20_000
    pixels = image.imread(path)
    assert pixels.shape[0] > 300 and pixels.shape[1] > 1000
    assert pixels[..., :3].std() > 0.05  # not a blank canvas


def test_a_cost_is_the_median_over_seeds_so_one_contended_run_does_not_move_it():
    """Measured on this machine's suite: one CNN DP-Adam seed ran beside a heavier cell at 0.183 s a step."""
    entry = Entry("t", "dpadam", "dpadam", "DP-Adam", 3, metric="accuracy", by_seed={0: 0.9, 1: 0.91, 2: 0.9},
                  peak_mb=[560.0, 650.0, 600.0], step_s=[0.059, 0.079, 0.183])
    assert entry.cost("step_s") == 0.079 and entry.cost("peak_mb") == 600.0


def test_seconds_per_step_is_measured_where_samples_per_s_is(tmp_path):
    """The MiniLM head's cells: 40 steps of 2 ms in about a second of training, most of it the trainer's own."""
    results = {"test_metric": "accuracy", "test_accuracy": 0.76, "samples_per_s": 158_382.0,
               "step_time_s": 0.0016, "train_time_s": 0.98, "steps": 40, "peak_memory_mb": 11.0}
    cell = {"task": "t", "method": "nonprivate", "variant": "nonprivate", "label": "non-private Adam",
            "phase": "test", "epsilon": None, "seed": 0, "lr": 0.01, "clip_norm": None}
    entries, _ = summarize([Outcome(cell, "done", results, None, tmp_path)])
    (entry,) = entries["t"]
    assert entry.cost("step_s") == 0.0016 and entry.cost("wall_s") == 0.98


def test_a_dry_run_marks_what_is_recorded_and_estimates_the_rest(tmp_path, capsys):
    """After one method has run, the dry run follows its recorded search to the test cells it chose (not the first
    grid point's, which never ran) and prices the rest from the recorded cells' process times."""
    from dpbench.leaderboard.__main__ import main

    suite_file = tmp_path / "suite.yaml"
    suite_file.write_text(SUITE)
    suite, root = _suite(tmp_path), tmp_path / "cells"
    cnn = suite.tasks[0]
    ran = Simulated(suite, root)
    ran.run_method(cnn, cnn.methods[1])  # DP-SGD: its grown searches and the seeds at their optimum
    assert main(["--suite", str(suite_file), "--profile", "p", "--root", str(root), "--dry-run", "--jobs", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    listed = {line.split()[-1]: line.split()[0] for line in lines[:-1]}
    dpsgd = {str(cell.directory(root)) for cell in ran.planned}
    assert {path for path, state in listed.items() if state == "recorded"} == dpsgd
    to_run = [path for path, state in listed.items() if state != "recorded"]
    on_cnn = [path for path in to_run if "/cnn/" in path]
    assert on_cnn and len(on_cnn) + 3 == len(to_run)  # the cost-only BiLSTM's three seeds: no cell of it ran
    hours = len(on_cnn) * 1.0 / 3600  # every recorded cell took 1 s here (Simulated's process_wall_s)
    assert lines[-1] == (f"{len(dpsgd)} cells recorded, {len(to_run)} to run at least (grids that grow add more): "
                         f"about {hours:.1f} h of cell processes, {hours / 2:.1f} h at --jobs 2 at best, from the "
                         "process times of each task's and method's finished cells; 3 cells of tasks with no finished "
                         "cell are not in that estimate")
    planned = Scheduler(suite, root, dry_run=True)
    planned.run()
    left = remaining(planned.planned, root)  # the printed hours round to 0.0: the seconds themselves
    assert (left.recorded_cells, len(left.to_run), left.unestimated) == (len(dpsgd), len(to_run), 3)
    assert left.seconds == pytest.approx(len(on_cnn) * 1.0)


def test_a_published_recipe_shows_only_its_own_budgets(tmp_path):
    """Tramer & Boneh's tasks run their recipe at epsilon 3 alone: no empty columns for budgets they never run."""
    text = SUITE.replace("  lstm:\n", """  tb:
    title: T&B CNN
    overrides: [model=cnn, data=mnist5k]
    optimizer: sgd
    lr: {sgd: [0.5, 2.0]}
    clip: [0.5, 2.0]
    validation_size: 200
    fixed: {lr: 4.0, clip: 0.1}
    budgets: [3]
  lstm:
""", 1).replace("      lstm: {methods: [dpsgd]}", "      tb: {methods: [dpsgd]}")
    suite, root, docs = _suite(tmp_path, text), tmp_path / "cells", tmp_path / "docs"
    Simulated(suite, root).run()
    section = build(suite, root, docs, "pytest").read_text().split("### T&B CNN")[1].split("###")[0]
    assert "seeds (the recipe learning rate and clip norm)" in section
    header = next(line for line in section.splitlines() if line.startswith("| method |"))
    assert header == "| method | epsilon 3 | non-private | samples/s | peak MB | s/step | wall s |"
    row = next(line for line in section.splitlines() if line.startswith("| DP-SGD |"))
    assert row.split(" | ")[1].endswith("(lr 4, clip 0.1)") and row.count("|") == header.count("|")


def test_a_task_runs_those_of_its_own_budgets_that_the_profile_runs(tmp_path):
    """D2P2's setting is anchored at epsilon 1 and 8 only: the full profile runs both, a smoke profile without 8 the
    one it has, and a task left with none is refused by name. Its costs come from a budget it ran, and say which;
    cells recorded at a budget since dropped stay out of the report."""
    def with_budgets(budgets: str) -> str:
        own = f"    budgets: {budgets}\n"
        return SUITE.replace("    cost_only: true\n", "    cost_only: true\n" + own, 1).replace(
            "    anchors:\n", own + "    anchors:\n", 1)

    suite = _suite(tmp_path, with_budgets("[1, 8]"))
    assert {task.name: task.budgets for task in suite.tasks} == {"cnn": (1.0,), "lstm": (1.0,)}
    with pytest.raises(ConfigurationError, match=r"tasks.cnn.budgets \[8\] has none of profile 'p'"):
        _suite(tmp_path, with_budgets("[8]"))
    root, docs = tmp_path / "cells", tmp_path / "docs"
    Simulated(_suite(tmp_path), root).run()  # the task ran epsilon 3 too before its budgets were narrowed
    Simulated(suite, root).run()
    markdown = build(suite, root, docs, "pytest").read_text()
    assert "budgets the suite no longer runs" in markdown
    assert not [line for line in markdown.splitlines() if line.startswith("| CNN (26K) | 3 |")]  # at a glance
    section = markdown.split("### CNN (26K)")[1].split("###")[0]
    header = next(line for line in section.splitlines() if line.startswith("| method |"))
    assert header.startswith("| method | epsilon 1 | non-private |")
    row = next(line for line in section.splitlines() if line.startswith("| DP-SGD |"))
    assert "(at epsilon 1)" in row


def test_long_task_titles_wrap_instead_of_running_into_the_next_panel():
    import matplotlib.pyplot as plt

    from dpbench.leaderboard.plots import TITLE_WIDTH, draw_epsilon

    title = ("pretrained MiniLM (22.7M) fine-tuned privately with DP-LoRA (74.5K trainable), on Rotten Tomatoes "
             "sentences")
    entry = Entry("t", "dpadam", "dpadam", "DP-Adam", 3, metric="accuracy", by_seed={0: 0.77, 1: 0.78, 2: 0.76})
    figure, axes = plt.subplots()
    assert draw_epsilon(axes, [entry], title, 1e-5, legend=False)
    lines = axes.get_title().splitlines()
    assert len(lines) == 2 and max(len(line) for line in lines) <= TITLE_WIDTH and " ".join(lines) == title
    plt.close(figure)


def test_a_published_figure_is_drawn_beside_the_cell_that_reproduces_it():
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgba

    from dpbench.core.method_style import style_of
    from dpbench.leaderboard.plots import PUBLISHED, draw_epsilon

    entries = [Entry("t", "dpsgd", "dpsgd", "DP-SGD", 1, metric="accuracy", by_seed={0: 0.58, 1: 0.59, 2: 0.6}),
               Entry("t", "d2p2_paper_p", "d2p2_paper_p", "D2P2-SGD (p = 0.3 d)", 1, metric="accuracy",
                     by_seed={0: 0.61, 1: 0.62, 2: 0.6})]
    figure, axes = plt.subplots()
    assert draw_epsilon(axes, entries, "its paper's CNN", 1e-5, published=[("D2P2-SGD (p = 0.3 d)", 1.0, 0.7132),
                                                                           ("DP2-SGD (constant noise)", 1.0, 0.63)])
    dashes = [line for line in axes.get_lines() if line.get_gid() == "published"]
    assert [(line.get_xdata()[0], line.get_ydata()[0]) for line in dashes] == [(1.0, 0.7132), (1.0, 0.63)]
    assert to_rgba(dashes[0].get_color()) == to_rgba(style_of("D2P2-SGD (p = 0.3 d)").colour)
    # a published method with no run of its own yet keeps its own colour, not one derived from its suite name
    assert to_rgba(dashes[1].get_color()) == to_rgba(style_of("DP2-SGD (constant noise)").colour)
    assert axes.get_legend_handles_labels()[1].count(PUBLISHED) == 1
    assert axes.get_ylim()[1] >= 0.7132  # the axis reaches the published level
    plt.close(figure)


def test_two_non_private_baselines_in_one_task_are_told_apart_in_both_figures():
    """D2P2's CNN task has a non-private SGD and a non-private Adam ceiling: one black line for both hid which."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgba

    from dpbench.core.method_style import style_of
    from dpbench.leaderboard.plots import _draw_cost, draw_epsilon

    def entry(method: str, label: str, epsilon: float | None, accuracy: float) -> Entry:
        return Entry("t", method, method, label, epsilon, metric="accuracy",
                     by_seed={0: accuracy, 1: accuracy + 0.01, 2: accuracy - 0.01}, peak_mb=[300, 301, 302],
                     step_s=[0.3, 0.31, 0.32])

    entries = [entry("nonprivate", "non-private SGD", None, 0.5),
               entry("nonprivate_adam", "non-private Adam", None, 0.8), entry("dpsgd", "DP-SGD", 3, 0.7)]
    figure, (left, right) = plt.subplots(1, 2)
    assert draw_epsilon(left, entries, "D2P2's CNN", 1e-5) and _draw_cost(right, entries, "step_s", "s")
    ceilings = {line.get_label(): to_rgba(line.get_color()) for line in left.get_lines()}  # the dashed lines
    stars = {bars.get_label(): to_rgba(bars.lines[0].get_color()) for bars in right.containers}
    expected = {label: to_rgba(style_of(label).colour) for label in ("non-private SGD", "non-private Adam")}
    assert expected["non-private SGD"] != expected["non-private Adam"]
    for drawn in (ceilings, stars):
        assert {label: drawn[label] for label in expected} == expected
    plt.close(figure)
