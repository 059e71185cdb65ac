"""dpbench.report: what each figure plots (read back from the drawn artists), the table, and where reports go."""

import csv
import json
import os
import subprocess
import sys

import pytest

from dpbench.report.build import build_report, tabulate
from dpbench.report.collect import collect_results
from dpbench.report.plots import report_figures

DEFAULT_PRIVACY = {"epsilon": 3.0, "delta": 1e-5, "clip_norm": 1.0, "noise_multiplier": None}


def write_run(directory, privatizer="vanilla", epsilon=3.0, batch_size=64, accuracy=0.8, samples_per_s=100.0,
              memory_mb=50.0, model="cnn", spent=None, variant=None, extra=None):
    """A results.json as dpbench.run writes it (only the fields the report reads)."""
    private = privatizer != "nonprivate"
    config = {"privatizer": {"name": privatizer, **(variant or {})}, "model": {"name": model},
              "data": {"name": "mnist5k"}, "batch_size": batch_size, "privacy": {**DEFAULT_PRIVACY, "epsilon": epsilon},
              "seed": 0, **(extra or {})}
    directory.mkdir(parents=True)
    (directory / "results.json").write_text(json.dumps({
        "privatizer": privatizer, "private": private, "model": model, "data": "mnist5k",
        "epsilon": (spent if spent is not None else epsilon * 0.99) if private else None,
        "target_epsilon": epsilon if private else None, "batch_size": batch_size, "test_metric": "accuracy",
        "test_accuracy": accuracy, "samples_per_s": samples_per_s, "peak_memory_mb": memory_mb, "config": config,
    }))


def figures_of(directory):
    table, _ = tabulate(collect_results([directory]))
    return table, report_figures(table)


def lines_of(figure):
    """label -> (xs, ys) of every line drawn on the figure's axes."""
    (axes,) = figure.axes
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in axes.get_lines()}


def bars_of(figure):
    (axes,) = figure.axes
    labels = [tick.get_text().replace("\n", " ") for tick in axes.get_yticklabels()]
    return dict(zip(labels, [patch.get_width() for patch in axes.patches], strict=True))


def grid_sweep(root):
    """nonprivate and vanilla at two epsilons and two batch sizes: every configuration has its own speed."""
    speeds = {}
    for epsilon in (1.0, 8.0):
        for batch_size in (64, 256):
            for privatizer in ("nonprivate", "vanilla"):
                speed = batch_size * (1.0 if privatizer == "nonprivate" else 0.5) + epsilon
                write_run(root / f"{privatizer}_{epsilon}_{batch_size}", privatizer, epsilon, batch_size,
                          samples_per_s=speed)
                speeds[privatizer, epsilon, batch_size] = speed
    return speeds


def test_throughput_has_one_bar_per_configuration_labelled_by_epsilon_and_batch(tmp_path):
    speeds = grid_sweep(tmp_path)
    _, figures = figures_of(tmp_path)
    bars = bars_of(figures["samples_per_s.png"])
    expected = {f"vanilla, B={b}, ε={e:g}": s for (p, e, b), s in speeds.items() if p == "vanilla"}
    # a non-private run ignores epsilon: its runs at both epsilons are one configuration (mean of the two)
    expected.update({f"nonprivate, B={b}": (speeds["nonprivate", 1.0, b] + speeds["nonprivate", 8.0, b]) / 2
                     for b in (64, 256)})
    assert bars == pytest.approx(expected)


def test_throughput_labels_do_not_squash_the_chart(tmp_path):
    for lr in (0.1, 0.01, 0.001):
        for r in (1, 5):
            write_run(tmp_path / f"jl_{lr}_{r}", "jl", variant={"projections": r, "noise_decay": 0.999},
                      extra={"optimizer": {"name": "dp_sgd_with_a_very_long_name", "lr": lr,
                                           "learning_rate_schedule_warmup_fraction": lr * 2}},
                      samples_per_s=lr * 1000 + r)
    _, figures = figures_of(tmp_path)
    figure = figures["samples_per_s.png"]
    bars = bars_of(figure)
    assert len(bars) == 6 and all("optimizer.lr=" in label and "r=" in label for label in bars)
    renderer = figure.canvas.get_renderer()
    figure.draw(renderer)
    page = figure.bbox
    (axes,) = figure.axes
    assert axes.bbox.width >= 0.35 * page.width and axes.bbox.height >= 0.5 * page.height
    for tick in axes.get_yticklabels():  # every label readable in full, inside the figure
        box = tick.get_window_extent(renderer)
        assert box.x0 >= page.x0 - 1 and box.y0 >= page.y0 - 1 and box.y1 <= page.y1 + 1


def test_metric_vs_epsilon_draws_each_models_nonprivate_baseline(tmp_path):
    for model, ceiling in (("cnn", 0.95), ("mlp", 0.9)):
        write_run(tmp_path / f"{model}_np", "nonprivate", model=model, accuracy=ceiling)
        for epsilon in (1.0, 3.0):
            write_run(tmp_path / f"{model}_{epsilon}", "vanilla", epsilon, model=model, spent=epsilon - 0.1,
                      accuracy=ceiling - 0.3 / epsilon)
    _, figures = figures_of(tmp_path)
    lines = lines_of(figures["metric_vs_epsilon.png"])
    assert lines["vanilla, model=cnn"] == (pytest.approx([0.9, 2.9]), pytest.approx([0.65, 0.85]))
    assert lines["vanilla, model=mlp"] == (pytest.approx([0.9, 2.9]), pytest.approx([0.6, 0.8]))
    assert set(lines["nonprivate, model=cnn (no privacy)"][1]) == {0.95}  # a horizontal line at the ceiling
    assert set(lines["nonprivate, model=mlp (no privacy)"][1]) == {0.9}
    assert len(lines) == 4


def test_memory_vs_batch_draws_one_line_per_epsilon(tmp_path):
    for epsilon, base in ((1.0, 100.0), (8.0, 400.0)):
        for batch_size in (64, 256):
            write_run(tmp_path / f"{epsilon}_{batch_size}", "vanilla", epsilon, batch_size,
                      memory_mb=base + batch_size)
    _, figures = figures_of(tmp_path)
    lines = lines_of(figures["memory_vs_batch.png"])
    assert lines == {"vanilla, ε=1": ([64, 256], [164.0, 356.0]), "vanilla, ε=8": ([64, 256], [464.0, 656.0])}


def test_epsilon_vs_jl_dimension_is_one_line_along_r(tmp_path):
    for r, spent in ((1, 9.0), (5, 4.0), (10, 3.5)):
        write_run(tmp_path / f"jl_{r}", "jl", variant={"projections": r}, spent=spent)
    _, figures = figures_of(tmp_path)
    assert lines_of(figures["epsilon_vs_jl_dimension.png"]) == {"jl": ([1, 5, 10], [9.0, 4.0, 3.5])}


def test_report_of_several_sweeps_leaves_each_sweeps_own_report_alone(tmp_path):
    first, second, work = tmp_path / "sweep_a", tmp_path / "sweep_b", tmp_path / "work"
    write_run(first / "0_vanilla", "vanilla", 1.0, samples_per_s=10.0)
    write_run(second / "0_vanilla", "vanilla", 8.0, samples_per_s=20.0)
    own = build_report([first])
    assert own["out"] == first
    before = {name: (first / name).read_bytes() for name in ("report.md", "report.csv", "samples_per_s.png")}
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    run = subprocess.run([sys.executable, "-m", "dpbench.report", str(first), str(second)], cwd=work, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert {name: (first / name).read_bytes() for name in before} == before
    (combined,) = (work / "outputs" / "reports").iterdir()
    assert f"(in {combined.relative_to(work)})" in run.stdout
    with (combined / "report.csv").open() as handle:
        assert sorted(float(row["samples_per_s"]) for row in csv.DictReader(handle)) == [10.0, 20.0]
    chosen = build_report([first, second], tmp_path / "chosen")
    assert chosen["out"] == tmp_path / "chosen" and (tmp_path / "chosen" / "samples_per_s.png").exists()
    assert {name: (first / name).read_bytes() for name in before} == before
