"""Figures a paper takes as they are: one style per method across figures, chance drawn, no single-point zoom, runs
at chance neither stretching the axis nor on a Pareto front, tick labels apart, legends of at most ten rows a column,
and frontier plots with a batch axis and a plain title."""

from __future__ import annotations

from itertools import combinations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from dpbench.app.frontier import FrontierRow  # noqa: E402
from dpbench.app.frontier_plot import plain_title, plot_frontier  # noqa: E402
from dpbench.app.max_batch import Trial  # noqa: E402
from dpbench.core.method_style import LEGEND_ROWS, style_of  # noqa: E402
from dpbench.leaderboard.plots import _draw_cost, draw_epsilon, headline_plot  # noqa: E402
from dpbench.leaderboard.suite import load_suite  # noqa: E402
from dpbench.leaderboard.summary import Entry  # noqa: E402
from dpbench.report.plots import Point, Series, draw_lines  # noqa: E402
from dpbench.report.style import y_view  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture
def saved(monkeypatch) -> list[Figure]:
    """Every figure saved during the test, kept for inspection after the code under test closed it."""
    figures: list[Figure] = []
    save = Figure.savefig

    def keep(figure: Figure, *args, **kwargs):
        figures.append(figure)
        return save(figure, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return figures


def entry(label: str, epsilon: float | None, accuracy: float, peak: float = 300.0, step: float = 0.1,
          metric: str = "accuracy") -> Entry:
    return Entry("t", label, label, label, epsilon, metric=metric,
                 by_seed={0: accuracy - 0.004, 1: accuracy, 2: accuracy + 0.004},
                 peak_mb=[peak, peak * 1.01, peak * 0.99], step_s=[step, step * 1.01, step * 0.99])


def _overlaps(labels) -> list[tuple[str, str]]:
    """Pairs of drawn tick labels whose boxes intersect."""
    shown = [(label.get_text(), label.get_window_extent()) for label in labels if label.get_text()]
    return [(a, b) for (a, box_a), (b, box_b) in combinations(shown, 2) if box_a.overlaps(box_b)]


def _legend_columns(legend) -> list[int]:
    """Entries per column of a drawn legend, from where its texts sit."""
    columns: dict[int, int] = {}
    for text in legend.get_texts():
        x = round(text.get_window_extent().x0)
        columns[x] = columns.get(x, 0) + 1
    return list(columns.values())


def test_every_label_the_suite_can_show_has_its_own_colour_and_marker():
    """Every method and rung of every task of the suite file: the styles are a function of the label alone, so one
    check over all of them holds for any figure that shows some."""
    suite = load_suite("full")
    labels = sorted({variant.label for task in suite.tasks for method in task.methods
                     for variant in method.variants()})
    assert len(labels) > 15
    styles = [style_of(label) for label in labels]
    assert len({style.colour for style in styles}) == len(labels)
    assert len({(style.colour, style.marker) for style in styles}) == len(labels)


def test_the_methods_compared_most_each_have_a_marker_of_their_own():
    """A figure read in grey tells DP-SGD from D2P-SGD and JL's rung from DP-GaLore by marker alone (the review found
    circles and hexagons shared)."""
    from dpbench.core.method_style import FIRST
    from dpbench.core.methods import method_label

    markers = [style_of(method_label(privatizer, optimizer)).marker for privatizer, optimizer in FIRST]
    assert len(set(markers)) == len(FIRST) == 13


def test_a_method_has_the_same_colour_in_figures_that_show_different_methods():
    few = [entry("DP-SGD-JL (r=10)", 3, 0.9)]
    many = [entry(label, 3, 0.8) for label in ("DP-SGD", "DP-Adam", "DP-SGD-JL (r=2)")] + few
    colours = []
    for entries in (few, many):
        figure, axes = plt.subplots()
        draw_epsilon(axes, entries, "t", 1e-5)
        colours.append({c.get_label(): to_rgba(c.lines[0].get_color()) for c in axes.containers})
    assert colours[0]["DP-SGD-JL (r=10)"] == colours[1]["DP-SGD-JL (r=10)"] != colours[1]["DP-SGD-JL (r=2)"]


def test_a_task_with_a_chance_level_draws_it_and_a_loss_task_its_constant_prediction():
    figure, (left, right) = plt.subplots(1, 2)
    draw_epsilon(left, [entry("DP-SGD", 3, 0.72), entry("non-private SGD", None, 0.76)], "t", 1e-5, chance=0.5915)
    draw_epsilon(right, [entry("DP-Adam", 1, 5.0, metric="loss"), entry("DP-Adam", 8, 3.6, metric="loss"),
                         entry("non-private Adam", None, 3.0, metric="loss")], "t", 1e-6, chance=3.1395)
    for axes, name, level in ((left, "chance", 0.5915), (right, "constant prediction", 3.1395)):
        (line,) = [line for line in axes.get_lines() if line.get_label() == name]
        assert list(line.get_ydata()) == [level, level] and line.get_linestyle() == "--"
        assert name in axes.get_legend_handles_labels()[1]


def test_a_chance_level_far_from_the_runs_is_written_on_the_edge_it_lies_beyond():
    """Tramer & Boneh's runs at 84-89% and chance at 10%: taking the line in would squash the runs, and leaving it
    out left no chance level on the panel."""
    figure, axes = plt.subplots()
    draw_epsilon(axes, [entry("DP-SGD", 2.38624, 0.86)], "t", 1e-5, chance=0.1)
    assert axes.get_ylim()[0] > 0.7 and "chance" not in axes.get_legend_handles_labels()[1]
    (note,) = [text for text in axes.texts if text.get_gid() == "reference_off_view"]
    assert note.get_text() == "chance 10.0%: below the axis"
    assert [label.get_text() for label in axes.get_xticklabels()] == ["2.39"]  # a per-run epsilon, not 2.38624


def test_a_single_point_is_not_zoomed_into_its_own_noise():
    """Tramer & Boneh's CNN: one point at 86.5% [86.2, 86.9] once filled a 0.860-0.869 axis."""
    figure, axes = plt.subplots()
    draw_epsilon(axes, [entry("DP-SGD", 3, 0.865)], "t", 1e-5, published=[("DP-SGD", 3.0, 0.86)])
    low, high = axes.get_ylim()
    assert high - low >= 0.1 and low < 0.86 and high > 0.869
    assert y_view([0.97, 0.99], "accuracy") == (pytest.approx(0.89), 1.0)  # kept within 0-1
    low, high = y_view([35.6, 36.5], "loss")
    assert high - low >= 3.6  # another metric: at least 10% of its size


def test_a_run_at_chance_neither_stretches_the_axis_nor_joins_the_pareto_front():
    """CNN on MNIST-5k: JL at r = 2 stays at chance (10%) while the rest lie at 76-95%; the JL run is also the
    cheapest, and a cheap run that learned nothing sat on the memory front."""
    chance = 0.1
    learned = [entry("DP-SGD", 3, 0.93, peak=600), entry("DP-Adam", 3, 0.91, peak=500),
               entry("D2P2-SGD", 3, 0.86, peak=700)]
    at_chance = entry("DP-SGD-JL (r=2)", 3, 0.1, peak=100)
    figure, (left, right) = plt.subplots(1, 2)
    draw_epsilon(left, [*learned, at_chance], "t", 1e-5, chance=chance)
    assert left.get_ylim()[0] > 0.7
    (marker,) = [line for line in left.get_lines() if line.get_gid() == "off_view"]
    assert list(marker.get_ydata()) == [left.get_ylim()[0]] and marker.get_marker() == style_of(at_chance.label).marker
    assert any("runs at or below chance (10.0%)" in text.get_text() for text in left.texts)
    assert not [text for text in left.texts if text.get_gid() == "reference_off_view"]  # one note on that edge
    _draw_cost(right, [*learned, at_chance], "peak_mb", "MB", chance=chance)
    (front,) = [line for line in right.get_lines() if line.get_label().startswith("Pareto")]
    assert 100 not in list(front.get_xdata()) and min(front.get_xdata()) == 500


def test_cost_axes_spanning_decades_or_long_decimals_keep_their_tick_labels_apart(tmp_path):
    """The skip-gram task's time axis (0.0015 ... 0.0033 s) printed its labels over each other; a time axis from
    milliseconds to minutes must stay readable too."""
    for steps in ((0.00143, 0.00301, 0.00314, 0.00331), (0.0014, 0.05, 3.0, 300.0)):
        entries = [entry(f"DP-SGD-JL (r={index})", 3, 0.8 + index / 100, peak=40 + index, step=step)
                   for index, step in enumerate(steps)]
        figure, axes = plt.subplots(figsize=(5, 4))
        _draw_cost(axes, entries, "step_s", "time per training step (s)")
        figure.canvas.draw()
        labels = axes.xaxis.get_ticklabels()
        assert len([label for label in labels if label.get_text()]) >= 2
        assert _overlaps(labels) == []
        assert _overlaps(axes.yaxis.get_ticklabels()) == []
        plt.close(figure)


def test_a_figure_of_many_methods_splits_its_legend_into_columns_of_at_most_ten(tmp_path, saved):
    """The headline's nineteen entries once formed one column taller than the panels; one legend of every task's
    methods then still held 18. Each panel now lists what it draws."""
    labels = ["DP-SGD", "DP-Adam", "non-private SGD", "DP-GRAPE (Adam)", "DP-GaLore (Adam)", "D2P2-SGD",
              "D2P-SGD (no projection)", "DP2-SGD (constant noise)", "sparse DP-Adam", "D2P2-SGD (p = 0.3 d)",
              *(f"DP-SGD-JL (r={r})" for r in (1, 2, 10, 30)), *(f"DP-Adam-JL (r={r})" for r in (1, 2, 10, 30, 5))]
    entries = [entry(label, eps, 0.5 + index / 50) for index, label in enumerate(labels) for eps in (1, 3)]
    panels = [("task a", entries[:16], 1e-5, [], None, True), ("task b", entries[14:], 1e-5, [], None, True)]
    assert headline_plot(panels, tmp_path / "headline.png").exists()
    (headline,) = saved
    headline.canvas.draw()
    assert not headline.legends
    first, second = (axes.get_legend() for axes in headline.axes if axes.get_visible())
    assert [text.get_text() for text in first.get_texts()] == labels[:8]
    assert [text.get_text() for text in second.get_texts()] == labels[7:]
    assert _legend_columns(first) == [8] and _legend_columns(second) == [6, 6]  # 12 entries: two columns
    figure, axes = plt.subplots()
    draw_epsilon(axes, entries, "t", 1e-5)
    figure.canvas.draw()
    columns = _legend_columns(axes.get_legend())
    assert sum(columns) == len(labels) and max(columns) <= LEGEND_ROWS
    series = [Series(label, label, [Point(1.0, 0.5, None), Point(3.0, 0.6, None)]) for label in labels]
    report = draw_lines(series, "t", "epsilon", "test accuracy", metric="accuracy")
    report.canvas.draw()
    assert max(_legend_columns(report.axes[0].get_legend())) <= LEGEND_ROWS


def test_a_report_metric_panel_shows_its_dodged_lines_and_is_not_zoomed_into_one_configuration():
    """Lines that share an epsilon are drawn a few points apart; drawn so, they once left the axes at -0.05-0.05."""
    series = [Series(label, label, [Point(eps, 0.865, (0.862, 0.869)) for eps in (1.0, 8.0)])
              for label in ("DP-SGD", "DP-Adam")]
    (axes,) = draw_lines(series, "t", "epsilon (spent)", "test accuracy", metric="accuracy").axes
    low, high = axes.get_ylim()
    assert high - low >= 0.1 and low < 0.862 and high > 0.869
    assert axes.get_xlim()[0] < 1.0 and axes.get_xlim()[1] > 8.0


def test_frontier_plots_have_a_plain_title_and_their_batch_sizes_on_the_axis(tmp_path, saved):
    assert plain_title("model=opt model.size=1.3b (CPU)") == "opt (size 1.3b) on CPU: peak memory vs batch size"
    assert plain_title("default model (NVIDIA H100)") == "default model on NVIDIA H100: peak memory vs batch size"

    def row(privatizer: str, batches: list[int], peak: float) -> FrontierRow:
        trials = [Trial(b, fits=True, process_peak_mb=peak * b) for b in batches] + [Trial(2 * batches[-1], False)]
        return FrontierRow(privatizer, "cpu", batches[-1], None, None, 4, None, None, None, False, trials=trials)

    plot_frontier([row("vanilla", [4, 8, 16], 100.0), row("grape", [4, 8, 16, 32], 50.0)], 8192.0,
                  "model=opt model.size=125m (CPU)", tmp_path / "frontier.png", "adam")
    (figure,) = saved
    (axes,) = figure.axes
    assert "=" not in axes.get_title() and axes.get_title().startswith("opt (size 125m) on CPU")
    figure.canvas.draw()
    assert [label.get_text() for label in axes.xaxis.get_ticklabels()] == ["4", "8", "16", "32", "64"]
    lines = {line.get_label(): line for line in axes.get_lines()}
    assert to_rgba(lines["DP-Adam (ghost norms)"].get_color()) == to_rgba(style_of("DP-Adam").colour)
    assert lines["DP-GRAPE (Adam)"].get_marker() == style_of("DP-GRAPE (Adam)").marker


def test_a_cost_axis_is_not_zoomed_into_a_few_percent():
    """The MiniLM head's methods at 1.21-1.23 MB once filled the whole memory axis: a 2% difference drawn as a wide
    one."""
    from dpbench.leaderboard.plots import COST_SPAN, _draw_cost

    close = [entry("DP-SGD", 3, 0.72, peak=1.21), entry("DP-Adam", 3, 0.75, peak=1.23)]
    figure, axes = plt.subplots()
    assert _draw_cost(axes, close, "peak_mb", "peak memory (MB)")
    low, high = axes.get_xlim()
    assert high - low >= COST_SPAN * 1.23 and low <= 1.21 * 0.99 and high >= 1.23 * 1.01
    plt.close(figure)
