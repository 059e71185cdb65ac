"""dpbench.report: what each figure plots (read back from the drawn artists), the table, and where reports go."""

import csv
import json
import math
import os
import subprocess
import sys
from collections import defaultdict

import matplotlib.image
import matplotlib.pyplot as plt
import pytest
from matplotlib.colors import to_rgba

from dpbench.report.__main__ import main as report_main
from dpbench.report.build import build_report, tabulate
from dpbench.report.collect import collect_results
from dpbench.report.plots import report_figures

DEFAULT_PRIVACY = {"epsilon": 3.0, "delta": 1e-5, "clip_norm": 1.0, "noise_multiplier": None}
OPTIMIZERS = {"sgd": {"name": "sgd", "lr": 0.1, "momentum": 0.0}, "adam": {"name": "adam", "lr": 0.001,
                                                                           "betas": [0.9, 0.999], "eps": 1e-8}}


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def write_run(directory, privatizer="vanilla", epsilon=3.0, batch_size=64, accuracy=0.8, samples_per_s=100.0,
              memory_mb=50.0, model="cnn", spent=None, variant=None, extra=None, seed=0, optimizer="sgd",
              data="mnist5k", fields=None):
    """A results.json as dpbench.app.run writes it (only the fields the report reads)."""
    private = privatizer != "nonprivate"
    config = {"privatizer": {"name": privatizer, **(variant or {})}, "model": {"name": model},
              "data": {"name": data}, "batch_size": batch_size, "privacy": {**DEFAULT_PRIVACY, "epsilon": epsilon},
              "optimizer": OPTIMIZERS[optimizer], "seed": seed, **(extra or {})}
    directory.mkdir(parents=True)
    (directory / "results.json").write_text(json.dumps({
        "privatizer": privatizer, "private": private, "model": model, "data": data,
        "epsilon": (spent if spent is not None else epsilon * 0.99) if private else None,
        "target_epsilon": epsilon if private else None, "noise_multiplier": 4.0 / epsilon if private else None,
        "steps": 100, "batch_size": batch_size, "test_metric": "accuracy", "seed": seed,
        "test_accuracy": accuracy, "samples_per_s": samples_per_s, "peak_memory_mb": memory_mb, "config": config,
        **(fields or {}),
    }))


def figures_of(directory):
    table, _ = tabulate(collect_results([directory]))
    return table, report_figures(table)


def lines_of(figure):
    """label -> (xs, ys) of every line drawn on the figure's axes."""
    (axes,) = figure.axes
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in axes.get_lines()
            if not line.get_label().startswith("_")}  # not an error bar's caps


def bars_of(figure):
    (axes,) = figure.axes
    labels = [tick.get_text().replace("\n", " ") for tick in axes.get_yticklabels()]
    return dict(zip(labels, [patch.get_width() for patch in axes.patches], strict=True))


def error_bars_of(figure):
    """low, high, low, high, ... of every error bar drawn, along the bar's direction, in order."""
    (axes,) = figure.axes
    segments = [segment for collection in axes.collections for segment in collection.get_segments()]
    vertical = all(segment[0][0] == segment[1][0] for segment in segments)
    return [end for pair in sorted(sorted(segment[:, 1 if vertical else 0]) for segment in segments) for end in pair]


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


def test_throughput_has_one_bar_per_method_and_batch_pooled_over_the_privacy_budgets(tmp_path):
    """Epsilon does not change a step's cost: the runs at both budgets are repeats of one measurement (never split
    by epsilon), while batch sizes stay apart."""
    speeds = grid_sweep(tmp_path)
    _, figures = figures_of(tmp_path)
    bars = bars_of(figures["samples_per_s.png"])
    expected = {(f"DP-SGD, B={b}" if p == "vanilla" else f"non-private SGD, B={b}"):
                (speeds[p, 1.0, b] + speeds[p, 8.0, b]) / 2 for p in ("vanilla", "nonprivate") for b in (64, 256)}
    assert bars == pytest.approx(expected)


def test_intervals_stay_within_what_the_quantity_can_take_and_markers_at_one_epsilon_sit_apart(tmp_path):
    """Two seeds far apart: the t-interval of an accuracy would run past 0 and 1, of a throughput below 0."""
    for seed, (accuracy, speed) in enumerate(((0.05, 5.0), (0.95, 400.0))):
        for privatizer in ("vanilla", "jl"):
            write_run(tmp_path / f"{privatizer}_{seed}", privatizer, 3.0, accuracy=accuracy, samples_per_s=speed,
                      seed=seed)
    table, figures = figures_of(tmp_path)
    for entry in table:
        low, high = entry["test_value_ci95"]
        assert low == 0.0 and high == 1.0
        assert entry["samples_per_s_ci95"][0] == 0.0
    accuracy_bars = error_bars_of(figures["metric_vs_epsilon.png"])
    assert min(accuracy_bars) >= 0.0 and max(accuracy_bars) <= 1.0
    (axes,) = figures["metric_vs_epsilon.png"].axes
    drawn = [line.get_transform().transform((line.get_xdata()[0], line.get_ydata()[0]))[0]
             for line in axes.get_lines() if not line.get_label().startswith("_")]
    assert len(drawn) == 2 and abs(drawn[0] - drawn[1]) > 1  # both at epsilon 2.97: drawn apart, in display units
    assert min(error_bars_of(figures["samples_per_s.png"])) >= 0.0


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
    assert len(bars) == 6 and all(" lr=" in label and "r=" in label for label in bars)
    renderer = figure.canvas.get_renderer()
    figure.draw(renderer)
    page = figure.bbox
    (axes,) = figure.axes
    assert axes.bbox.width >= 0.35 * page.width and axes.bbox.height >= 0.5 * page.height
    for tick in axes.get_yticklabels():  # every label readable in full, inside the figure
        box = tick.get_window_extent(renderer)
        assert box.x0 >= page.x0 - 1 and box.y0 >= page.y0 - 1 and box.y1 <= page.y1 + 1


def test_each_task_gets_its_own_figure_with_its_own_baseline(tmp_path):
    for model, ceiling in (("cnn", 0.95), ("mlp", 0.9)):
        write_run(tmp_path / f"{model}_np", "nonprivate", model=model, accuracy=ceiling)
        for epsilon in (1.0, 3.0):
            write_run(tmp_path / f"{model}_{epsilon}", "vanilla", epsilon, model=model, spent=epsilon - 0.1,
                      accuracy=ceiling - 0.3 / epsilon)
    _, figures = figures_of(tmp_path)
    cnn = figures["metric_vs_epsilon_cnn_mnist5k.png"]
    mlp = figures["metric_vs_epsilon_mlp_mnist5k.png"]
    assert lines_of(cnn)["DP-SGD"] == (pytest.approx([0.9, 2.9]), pytest.approx([0.65, 0.85]))
    assert lines_of(mlp)["DP-SGD"] == (pytest.approx([0.9, 2.9]), pytest.approx([0.6, 0.8]))
    assert set(lines_of(cnn)["non-private SGD"][1]) == {0.95}  # a horizontal line at the ceiling
    assert set(lines_of(mlp)["non-private SGD"][1]) == {0.9}
    assert len(lines_of(cnn)) == len(lines_of(mlp)) == 2
    assert cnn.axes[0].get_title().startswith("cnn on mnist5k") and mlp.axes[0].get_title().startswith("mlp on")


def test_memory_vs_batch_draws_one_line_per_epsilon(tmp_path):
    for epsilon, base in ((1.0, 100.0), (8.0, 400.0)):
        for batch_size in (64, 256):
            write_run(tmp_path / f"{epsilon}_{batch_size}", "vanilla", epsilon, batch_size,
                      memory_mb=base + batch_size)
    _, figures = figures_of(tmp_path)
    lines = lines_of(figures["memory_vs_batch.png"])
    assert lines == {"DP-SGD, ε=1": ([64, 256], [164.0, 356.0]), "DP-SGD, ε=8": ([64, 256], [464.0, 656.0])}


def test_memory_vs_batch_only_when_the_sweep_varies_the_batch(tmp_path):
    for epsilon in (1.0, 8.0):
        write_run(tmp_path / f"vanilla_{epsilon}", "vanilla", epsilon, memory_mb=100 + epsilon)
        write_run(tmp_path / f"nonprivate_{epsilon}", "nonprivate", epsilon)
    _, figures = figures_of(tmp_path)
    assert "memory_vs_batch.png" not in figures and "metric_vs_epsilon.png" in figures


def test_epsilon_vs_jl_dimension_is_one_line_along_r(tmp_path):
    for r, spent in ((1, 9.0), (5, 4.0), (10, 3.5)):
        write_run(tmp_path / f"jl_{r}", "jl", variant={"projections": r}, spent=spent)
    _, figures = figures_of(tmp_path)
    assert lines_of(figures["epsilon_vs_jl_dimension.png"]) == {"DP-SGD-JL": ([1, 5, 10], [9.0, 4.0, 3.5])}


def test_runs_that_differ_in_any_key_but_the_seed_are_never_merged(tmp_path):
    for seed in (0, 1, 2):
        for epsilon in (1.0, 3.0, 8.0):
            write_run(tmp_path / f"np_{epsilon}_{seed}", "nonprivate", epsilon, seed=seed,
                      extra={"privacy": {**DEFAULT_PRIVACY, "epsilon": epsilon, "seed": seed * 7}})
    table, _ = figures_of(tmp_path)
    assert sorted((e["config"]["privacy.epsilon"], e["seeds"]) for e in table) == [(1.0, 3), (3.0, 3), (8.0, 3)]
    text = build_report([tmp_path])["markdown"].read_text()
    assert "1.00 (unused)" in text and "8.00 (unused)" in text


def test_mean_and_95_percent_interval_over_seeds(tmp_path):
    for seed, accuracy in enumerate((0.80, 0.82, 0.84)):
        for epsilon in (1.0, 8.0):
            write_run(tmp_path / f"{epsilon}_{seed}", "vanilla", epsilon, accuracy=accuracy - 0.1 / epsilon,
                      seed=seed)
    table, figures = figures_of(tmp_path)
    half = 4.302653 * 0.02 / math.sqrt(3)  # Student t(0.975, 2 degrees of freedom) * sd / sqrt(n)
    (one,) = [e for e in table if e["target_epsilon"] == 1.0]
    assert one["seeds"] == 3 and one["test_value"] == pytest.approx(0.72)
    assert one["test_value_ci95"] == pytest.approx((0.72 - half, 0.72 + half))
    assert lines_of(figures["metric_vs_epsilon.png"])["DP-SGD"][1] == pytest.approx([0.72, 0.8075])
    assert error_bars_of(figures["metric_vs_epsilon.png"]) == pytest.approx(
        [0.72 - half, 0.72 + half, 0.8075 - half, 0.8075 + half])


def test_throughput_shows_its_spread_over_seeds(tmp_path):
    for seed, speed in enumerate((90.0, 100.0, 110.0)):
        write_run(tmp_path / f"vanilla_{seed}", "vanilla", samples_per_s=speed, seed=seed)
    write_run(tmp_path / "nonprivate_0", "nonprivate", samples_per_s=300.0)
    table, figures = figures_of(tmp_path)
    figure = figures["samples_per_s.png"]
    half = 4.302653 * 10.0 / math.sqrt(3)
    assert bars_of(figure) == pytest.approx({"DP-SGD": 100.0, "non-private SGD": 300.0})
    assert error_bars_of(figure) == pytest.approx([100 - half, 100 + half])  # one seed: no interval to draw
    (axes,) = figure.axes
    assert "over seeds" in axes.get_xlabel() and "one samples/s" in axes.get_xlabel()
    assert {text.get_text() for text in axes.texts} == {"100 (n=3)", "300 (n=1)"}


def test_report_md_has_sigma_steps_optimizer_and_interval_columns(tmp_path):
    for seed, accuracy in enumerate((0.7, 0.8)):
        write_run(tmp_path / f"adam_{seed}", "vanilla", 2.0, accuracy=accuracy, seed=seed, optimizer="adam",
                  samples_per_s=50.0 + seed)
    report = build_report([tmp_path])
    header, _, row, *_ = report["markdown"].read_text().splitlines()
    cells = dict(zip(header.strip("| ").split(" | "), row.strip("| ").split(" | "), strict=True))
    assert cells["label"] == "DP-Adam" and cells["optimizer"] == "adam" and cells["sigma"] == "2"
    assert cells["steps"] == "100" and cells["seeds"] == "2"
    half = 12.7062 * math.sqrt(0.005) / math.sqrt(2)  # t(0.975, 1) * sd / sqrt(n)
    low, high = map(float, cells["test_value_ci95"].strip("[]").split(", "))
    assert (low, high) == pytest.approx((0.75 - half, 1.0), rel=1e-3)  # an accuracy's interval stops at 1
    assert cells["samples_per_s_ci95"].startswith("[")
    with report["csv"].open() as handle:
        (record,) = list(csv.DictReader(handle))
    assert float(record["test_value_ci95_low"]) == pytest.approx(0.75 - half, rel=1e-5)
    assert float(record["sigma"]) == 2.0


def test_each_method_keeps_its_colour_and_marker_in_every_figure_and_report(tmp_path):
    for batch_size in (64, 256):
        for epsilon in (1.0, 8.0):
            write_run(tmp_path / "a" / f"sgd_{batch_size}_{epsilon}", "vanilla", epsilon, batch_size)
            write_run(tmp_path / "a" / f"adam_{batch_size}_{epsilon}", "vanilla", epsilon, batch_size,
                      optimizer="adam")
        write_run(tmp_path / "a" / f"np_{batch_size}", "nonprivate", batch_size=batch_size)
    for epsilon in (1.0, 8.0):  # another report, where DP-Adam is the first and only method
        write_run(tmp_path / "b" / f"adam_{epsilon}", "vanilla", epsilon, optimizer="adam")
    colours, markers = defaultdict(set), defaultdict(set)
    for sweep in ("a", "b"):
        _, figures = figures_of(tmp_path / sweep)
        assert len(figures) == (3 if sweep == "a" else 2)
        for figure in figures.values():
            (axes,) = figure.axes
            for line in axes.get_lines():
                if line.get_label().startswith("_"):
                    continue  # an error bar's caps
                method = line.get_label().split(",")[0]
                colours[method].add(to_rgba(line.get_color()))
                if line.get_marker() not in (None, "None", ""):
                    markers[method].add(line.get_marker())
            if axes.patches:
                for tick, patch in zip(axes.get_yticklabels(), axes.patches, strict=True):
                    colours[tick.get_text().split(",")[0]].add(to_rgba(patch.get_facecolor()))
    assert set(colours) == {"DP-SGD", "DP-Adam", "non-private SGD"}
    assert all(len(found) == 1 for found in colours.values()), colours  # one colour per method in every figure
    assert len({found.pop() for found in colours.values()}) == 3  # a different one for each method
    assert len(markers["DP-SGD"]) == len(markers["DP-Adam"]) == 1 and markers["DP-SGD"] != markers["DP-Adam"]


def test_titles_name_the_task_and_its_scale(tmp_path):
    for epsilon in (1.0, 8.0):
        for batch_size in (64, 256):
            write_run(tmp_path / f"{epsilon}_{batch_size}", "vanilla", epsilon, batch_size,
                      fields={"parameters": 26010})
    _, figures = figures_of(tmp_path)
    assert set(figures) == {"metric_vs_epsilon.png", "memory_vs_batch.png", "samples_per_s.png"}
    for figure in figures.values():
        assert figure.axes[0].get_title().startswith("cnn on mnist5k, 26K parameters\n")


def test_legends_are_short_and_outside_the_data(tmp_path):
    """Keys that only follow a component's name (Adam's betas, JL's chunk) or never vary stay out of the legend."""
    for lr in (0.1, 0.01):
        for epsilon in (1.0, 8.0):
            for optimizer in ("sgd", "adam"):
                write_run(tmp_path / f"{optimizer}_{lr}_{epsilon}", "vanilla", epsilon, optimizer=optimizer,
                          variant={"engine": "ghost"}, extra={"optimizer": {**OPTIMIZERS[optimizer], "lr": lr}})
            write_run(tmp_path / f"jl_{lr}_{epsilon}", "jl", epsilon,
                      variant={"projections": 5, "noise_decay": 0.99, "chunk": 8},
                      extra={"optimizer": {**OPTIMIZERS["sgd"], "lr": lr}})
    _, figures = figures_of(tmp_path)
    figure = figures["metric_vs_epsilon.png"]
    (axes,) = figure.axes
    legend = axes.get_legend()
    assert sorted(text.get_text() for text in legend.get_texts()) == [
        "DP-Adam, lr=0.01", "DP-Adam, lr=0.1", "DP-SGD, lr=0.01", "DP-SGD, lr=0.1",
        "DP-SGD-JL (r=5, decay=0.99), lr=0.01", "DP-SGD-JL (r=5, decay=0.99), lr=0.1"]
    renderer = figure.canvas.get_renderer()
    figure.draw(renderer)
    box, data = legend.get_window_extent(renderer), axes.get_window_extent(renderer)
    assert box.x0 >= data.x1  # to the right of the axes, over no point


def test_cli_out_of_two_sweeps_keeps_each_tasks_baseline_on_its_own_axes(tmp_path, monkeypatch, capsys):
    for sweep, model, data, ceiling in (("a", "cnn", "mnist5k", 0.95), ("b", "lstm", "imdb", 0.85)):
        write_run(tmp_path / sweep / "np", "nonprivate", model=model, data=data, accuracy=ceiling)
        for epsilon in (1.0, 8.0):
            write_run(tmp_path / sweep / f"dp_{epsilon}", "vanilla", epsilon, model=model, data=data,
                      accuracy=ceiling - 0.1 / epsilon)
    out = tmp_path / "combined"
    monkeypatch.setattr(sys, "argv", ["dpbench.report", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out)])
    report_main()
    printed = capsys.readouterr().out
    for model, data in (("cnn", "mnist5k"), ("lstm", "imdb")):
        assert f"plot: {out / f'metric_vs_epsilon_{model}_{data}.png'}" in printed
    table, _ = tabulate(collect_results([tmp_path / "a", tmp_path / "b"]))
    figures = report_figures(table)
    for model, data, ceiling in (("cnn", "mnist5k", 0.95), ("lstm", "imdb", 0.85)):
        figure = figures[f"metric_vs_epsilon_{model}_{data}.png"]
        baselines = {label: ys for label, (_, ys) in lines_of(figure).items() if label.startswith("non-private")}
        assert baselines == {"non-private SGD": [ceiling, ceiling]}
        assert figure.axes[0].get_title().startswith(f"{model} on {data}")


def test_a_figure_renders_to_a_png_that_is_not_blank(tmp_path):
    for seed in (0, 1):
        write_run(tmp_path / f"np_{seed}", "nonprivate", accuracy=0.9 + seed / 100, seed=seed)
        for epsilon in (1.0, 3.0, 8.0):
            write_run(tmp_path / f"dp_{epsilon}_{seed}", "vanilla", epsilon, accuracy=0.8 - 0.1 / epsilon + seed / 50,
                      seed=seed)
    report = build_report([tmp_path])
    png = tmp_path / "metric_vs_epsilon.png"
    assert png in report["plots"]
    pixels = matplotlib.image.imread(png)
    height, width = pixels.shape[:2]
    assert 300 <= height <= 1200 and 600 <= width <= 2400, pixels.shape
    grey = pixels[..., :3].mean(axis=2)
    assert grey.var() > 0.01 and (grey < 0.9).mean() > 0.02  # drawn lines, text and bands, not a blank page


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


def test_the_leaderboards_methods_and_variants_each_have_a_colour_and_variants_keep_their_methods_hue():
    """The ViT task alone plots twelve methods and rungs: no two share a colour (JL's r=2 and r=10 once did), and a
    variant ("DP-Adam-JL (r=10)") is a shade of its method's hue, so it reads as its kin."""
    from colorsys import rgb_to_hls

    from dpbench.core.method_style import style_of

    labels = ["DP-SGD", "DP-Adam", "non-private SGD", "non-private Adam", "DP-Adam-JL (r=2)", "DP-Adam-JL (r=10)",
              "DP-Adam-JL (r=30)", "DP-GRAPE (Adam)", "DP-GaLore (Adam)", "D2P2-SGD", "D2P-SGD (no projection)",
              "DP2-SGD (constant noise)", "DP-SGD-JL (r=2)", "DP-SGD-JL (r=10)", "D2P2-SGD (p = 0.3 d)",
              "DP2-SGD (constant noise, p = 0.3 d)", "sparse DP-Adam", "sparse DP-Adam (paper's S2, sparsity)"]
    styles = [style_of(label) for label in labels]
    assert len({style.colour for style in styles}) == len(labels)
    assert len({(style.colour, style.marker) for style in styles}) == len(labels)
    for variant, method in [("DP-Adam-JL (r=10)", "DP-Adam-JL"), ("D2P2-SGD (p = 0.3 d)", "D2P2-SGD"),
                            ("DP-GRAPE (Adam) (rank=8)", "DP-GRAPE (Adam)")]:
        assert rgb_to_hls(*style_of(variant).colour)[0] == pytest.approx(rgb_to_hls(*style_of(method).colour)[0])
        assert style_of(variant).marker != style_of(method).marker
    assert style_of("DP2-SGD (constant noise)") == style_of("DP2-SGD")  # the suite's name for the same method
    assert len({style_of(label).colour for label in ["DP-SGD", "DP-Adam", "DP-Adam-JL", "DP-GRAPE (Adam)",
                                                      "DP-GaLore (Adam)", "D2P2-SGD", "D2P-SGD", "DP2-SGD"]}) == 8
