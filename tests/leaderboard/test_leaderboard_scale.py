"""The "claims at scale" section: DP-GRAPE's memory against the paper's baseline, judged only at the paper's scale,
from frontier records as `python -m dpbench.capacity frontier` writes them."""

import json
from dataclasses import asdict

import pytest

from dpbench.app.frontier import FrontierRow, refused_row
from dpbench.app.max_batch import Trial
from dpbench.leaderboard.__main__ import main
from dpbench.leaderboard.claims import LESS_MEMORY
from dpbench.leaderboard.scale import REGIME_PARAMETERS, rewrite, scale_section

INTERPRETER = 400.0


def row(privatizer: str, peak: float | None, parameters: int, rate: float = 2.0) -> FrontierRow:
    fits = peak is not None
    trials = [Trial(4, fits, process_peak_mb=peak, interpreter_rss_mb=INTERPRETER, parameters=parameters,
                    samples_per_s=rate if fits else None, stage="" if fits else "steps")]
    return FrontierRow(privatizer, "cpu", 4 if fits else 0, peak, rate if fits else None, 4, peak,
                       rate if fits else None, INTERPRETER, not fits, "" if fits else "out of memory at batch 1",
                       trials=trials)


def write(tmp_path, rows: list[FrontierRow], size: str = "350m", overrides: list[str] | None = None):
    folder = tmp_path / "frontier" / f"opt_{size}_cpu"
    folder.mkdir(parents=True)
    overrides = overrides or ["model=opt", f"model.size={size}", "data.max_length=32", "optimizer=adam"]
    (folder / "frontier.json").write_text(json.dumps({
        "overrides": overrides, "cap_mb": 20480.0,
        "device": "cpu", "device_name": "CPU", "fixed_batch": 4, "steps_per_trial": 4, "wall_s": 600.0,
        "rows": [asdict(r) for r in rows]}))
    return "\n".join(scale_section(tmp_path / "frontier"))


@pytest.mark.parametrize(("grape", "materialized", "verdict"), [
    (1400.0, 4400.0, "holds here"),  # 1000 / 4000 above the interpreter
    (3800.0, 4400.0, "**does not hold here**"),
    (3800.0, None, "holds here"),  # the baseline does not fit where GRAPE does
])
def test_grape_is_judged_against_the_papers_baseline_above_the_interpreter(tmp_path, grape, materialized, verdict):
    parameters = 2 * REGIME_PARAMETERS
    text = write(tmp_path, [row("nonprivate", 2400.0, parameters), row("vanilla", 3000.0, parameters),
                            row("materialized", materialized, parameters), row("grape", grape, parameters)])
    sentence = next(line for line in text.splitlines() if line.startswith("- DP-GRAPE's memory claim"))
    assert sentence.endswith(f": {verdict}.")
    assert f"{(grape - INTERPRETER) / (3000.0 - INTERPRETER):.2f}x DP-Adam (ghost norms)'s" in sentence
    if materialized:
        ratio = (grape - INTERPRETER) / (materialized - INTERPRETER)
        assert f"{ratio:.2f}x DP-Adam (materialized" in sentence and (ratio <= LESS_MEMORY) == (verdict == "holds here")
    assert "| DP-GRAPE (Adam) | 4 (none failed; the search's limit) |" in text
    assert "![opt_350m_cpu](leaderboard/frontier/opt_350m_cpu/frontier.png)" in text


def test_below_the_papers_scale_a_failing_claim_is_not_judged(tmp_path):
    parameters = REGIME_PARAMETERS // 4
    text = write(tmp_path, [row("materialized", 1000.0, parameters), row("grape", 1000.0, parameters)], "125m")
    assert f"not judged: {parameters / 1e6:.0f}M parameters is below the paper's regime" in text


def test_a_refused_baseline_is_not_a_win(tmp_path):
    parameters = 2 * REGIME_PARAMETERS
    text = write(tmp_path, [refused_row("materialized", "cpu", 4, "the model draws random numbers"),
                            row("grape", 1000.0, parameters)])
    assert "not judged: the baseline refused the model" in text and "| DP-Adam (materialized per-sample gradients) " \
        "| refused |" in text


def test_no_records_no_section(tmp_path):
    assert scale_section(tmp_path / "frontier") == []


def test_rewriting_the_section_keeps_the_rest_of_the_leaderboard(tmp_path):
    parameters = 2 * REGIME_PARAMETERS
    write(tmp_path / "leaderboard", [row("materialized", 4400.0, parameters), row("grape", 1400.0, parameters)])
    (tmp_path / "leaderboard.md").write_text("# dpbench leaderboard\n\n## Results per task\n\ncells\n")
    assert main(["--scale-only", "--docs", str(tmp_path)]) == 0
    rewrite(tmp_path)  # idempotent: the section is replaced, not appended twice
    text = (tmp_path / "leaderboard.md").read_text()
    assert text.startswith("# dpbench leaderboard\n\n## Results per task\n\ncells\n\n## Claims at scale")
    assert text.count("## Claims at scale") == 1 and "holds here" in text


@pytest.mark.parametrize(("jl_rate", "jl_peak", "speed", "memory"), [
    (4.0, 1300.0, "holds here", "holds here"),  # twice the baseline's speed; 900 / 800 MB above the interpreter
    (0.5, 1300.0, "**does not hold here**", "holds here"),
    (4.0, 2400.0, "holds here", "**does not hold here**"),  # 2000 / 800 = 2.5x non-private
])
def test_jl_is_judged_on_speed_against_materialized_and_memory_against_nonprivate(tmp_path, jl_rate, jl_peak, speed,
                                                                                   memory):
    text = write(tmp_path, [row("nonprivate", 1200.0, 10**6, 8.0), row("vanilla", 1300.0, 10**6, 3.0),
                            row("materialized", 3000.0, 10**6, 2.0), row("jl_r5", jl_peak, 10**6, jl_rate)],
                 overrides=["model=lstm", "optimizer=adam"])
    sentence = next(line for line in text.splitlines() if line.startswith("- DP-Adam-JL (r=5)'s claims"))
    assert f"{2.0 / jl_rate:.2f}x the materialized baseline's time" in sentence
    assert f"{(jl_peak - INTERPRETER) / 800.0:.2f}x non-private Adam's 800 MB" in sentence
    assert sentence.endswith(f"speed {speed}, memory {memory}.")
    assert "### lstm\n" in text and "Bu et al. 2021, Table 2" in text


@pytest.mark.parametrize(("sparse_rate", "sparse_peak", "verdict"), [
    (10.0, 1000.0, "holds here"),
    (5.0, 1000.0, "**does not hold here**"),  # 2x DP-SGD's step time
    (10.0, 2000.0, "**does not hold here**"),  # 1600 / 600 MB above the interpreter
])
def test_sparse_is_judged_on_step_time_and_memory_against_dp_sgd(tmp_path, sparse_rate, sparse_peak, verdict):
    text = write(tmp_path, [row("vanilla", 1000.0, 10**6, 10.0), row("sparse", sparse_peak, 10**6, sparse_rate)],
                 overrides=["model=word2vec", "model.vocab_size=20000"])
    sentence = next(line for line in text.splitlines() if line.startswith("- sparse DP-SGD's premise"))
    assert f"{10.0 / sparse_rate:.2f}x DP-SGD (ghost norms)'s time" in sentence
    assert f"{(sparse_peak - INTERPRETER) / 600.0:.2f}x DP-SGD (ghost norms)'s 600 MB" in sentence
    assert sentence.endswith(f": {verdict}.")
    assert "### word2vec, vocabulary 20,000" in text and "DP-GRAPE's memory claim" not in text


def test_dp_grape_on_one_device_is_set_against_dp_adam_sharded_over_n(tmp_path):
    """A frontier with `vanilla@4` (FSDP2 over 4 ranks): its row is kept apart from one-device DP-Adam (not its
    baseline), named as sharded, and DP-GRAPE is set against its largest rank's whole peak."""
    parameters = 2 * REGIME_PARAMETERS
    sharded = row("vanilla", 2000.0, parameters)
    sharded.devices = 4
    text = write(tmp_path, [row("vanilla", 5400.0, parameters), sharded, row("grape", 1400.0, parameters)])
    claim = next(line for line in text.splitlines() if line.startswith("- DP-GRAPE's memory claim"))
    assert f"{(1400.0 - INTERPRETER) / (5400.0 - INTERPRETER):.2f}x DP-Adam (ghost norms)'s" in claim
    versus = next(line for line in text.splitlines() if line.startswith("- DP-GRAPE on one device against"))
    assert "DP-Adam (ghost norms) sharded over 4 (FSDP2, per rank)" in versus and f"{1400 / 2000:.2f}x" in versus
    assert "| DP-Adam (ghost norms) sharded over 4 (FSDP2, per rank) | 4 " in text


def test_the_section_draws_each_records_figure_again_in_the_current_styles(tmp_path, monkeypatch):
    """The committed figures were drawn before frontier plots had a plain title and the leaderboard's method styles:
    the section re-plots every record it links."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgba
    from matplotlib.figure import Figure

    from dpbench.core.method_style import style_of

    saved: list[Figure] = []
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda figure, *a, **k: (saved.append(figure), save(figure, *a, **k))[1])
    write(tmp_path, [row("vanilla", 3000.0, REGIME_PARAMETERS), row("grape", 1400.0, REGIME_PARAMETERS)])
    stale = tmp_path / "frontier" / "opt_350m_cpu" / "frontier.png"
    stale.write_bytes(b"an old figure")
    saved.clear()
    scale_section(tmp_path / "frontier")
    (figure,) = saved
    (axes,) = figure.axes
    assert axes.get_title().startswith("opt (size 350m) on CPU") and "=" not in axes.get_title()
    lines = {line.get_label(): line for line in axes.get_lines()}
    assert to_rgba(lines["DP-GRAPE (Adam)"].get_color()) == to_rgba(style_of("DP-GRAPE (Adam)").colour)
    assert stale.read_bytes().startswith(b"\x89PNG")
    plt.close(figure)


def test_a_record_reads_back_into_the_rows_it_was_written_from():
    written = row("grape", 1400.0, REGIME_PARAMETERS)
    record = asdict(written)
    record["trials"][0]["a_field_of_another_version"] = 1.0
    assert FrontierRow.from_dict(record) == written
