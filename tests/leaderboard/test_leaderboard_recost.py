"""`--recost`: a task's chosen test cells run again on the current code, their costs written beside the cells' own,
and only that section of docs/leaderboard.md rewritten."""

import csv
import json

import pytest

from dpbench.leaderboard import build, load_suite
from dpbench.leaderboard.__main__ import main
from dpbench.leaderboard.recost import SECTION_TITLE, _peak_meaning, rewrite
from dpbench.leaderboard.report import CSV_COLUMNS
from dpbench.leaderboard.scale import SECTION_TITLE as SCALE_TITLE
from tests.helpers.leaderboard_suites import TINY

CHOSEN = [  # (task, variant, method, status, seed, epsilon, lr, clip, s/step, peak MB)
    ("cnn", "nonprivate", "nonprivate", "done", 3, "", 9.0, "", 0.05, 300.0),
    ("cnn", "nonprivate", "nonprivate", "done", 2, "", 1.0, "", 0.05, 300.0),
    ("cnn", "dpsgd", "dpsgd", "done", 0, "1.0", 0.7, 1.3, 0.1, 400.0),
    ("cnn", "dpsgd", "dpsgd", "done", 1, "1.0", 0.7, 1.3, 0.3, 500.0),
    ("cnn", "dpsgd", "dpsgd", "done", 0, "8.0", 2.0, 0.5, 0.9, 900.0),  # another budget than the costs': not run
    ("vit", "dpsgd", "dpsgd", "done", 0, "8.0", 0.5, 1.0, 0.2, 600.0),  # none at the costs' budget: this one runs
    ("vit", "jl_r1", "jl", "refused", 0, "1.0", 1.0, 1.0, "", ""),
]
NOISE = 2.5
"""The suite cells' noise multiplier (results.json's): a total budget's calibration, which --recost runs as it is; a
per-run profile's cells calibrate their own, as --recost's do."""
REFUSAL = ("privacy.epsilon=1 at delta=1e-06 is unreachable for this run even with noise multiplier 1000: the suite's "
           "reason")
BEFORE = "# dpbench leaderboard\n\nThe cells' tables.\n"
SCALE = f"{SCALE_TITLE}\n\nThe frontier records.\n"
OFFLINE = {"WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def _docs(tmp_path, chosen=CHOSEN):
    docs = tmp_path / "docs"
    (docs / "leaderboard").mkdir(parents=True)
    with (docs / "leaderboard" / "cells.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for task, variant, method, status, seed, epsilon, lr, clip, step, peak in chosen:
            writer.writerow({"task": task, "method": method, "variant": variant, "phase": "test", "status": status,
                             "target_epsilon": epsilon, "seed": seed, "lr": lr, "clip_norm": clip, "s_per_step": step,
                             "samples_per_s": 100 / step if step else "", "peak_memory_mb": peak,
                             "noise_multiplier": NOISE if status == "done" and epsilon and step else "",
                             "reason": REFUSAL if status == "refused" else ""})
        writer.writerow({"task": "cnn", "method": "dpsgd", "variant": "dpsgd", "phase": "tune", "status": "done",
                         "target_epsilon": "1.0", "seed": 0, "lr": 9.0, "clip_norm": 9.0})
    (docs / "leaderboard.md").write_text(BEFORE + "\n" + SCALE)
    return docs


TOTAL = TINY.replace("    tuning: {lr_points: 1, clip_points: 1, max_growth: 1, each_budget: false}\n",
                     "    budget: total\n    tuning: {lr_points: 1, clip_points: 1, max_growth: 1, each_budget: true, "
                     "trials: 1}\n")


def _argv(tmp_path, docs, tasks, suite_text=TINY):
    suite = tmp_path / "suite.yaml"
    suite.write_text(suite_text)
    return ["--suite", str(suite), "--profile", "tiny", "--docs", str(docs), "--root", str(tmp_path / "costs"),
            "--recost", tasks]


def _row(text, label):
    return next(line for line in text.splitlines() if line.startswith(f"| {label} |")).split(" | ")


def test_recost_runs_the_chosen_cells_and_rewrites_only_its_section(tmp_path, monkeypatch, clean_commit):
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    docs, root = _docs(tmp_path), tmp_path / "costs"
    argv = _argv(tmp_path, docs, "cnn")
    assert main(argv) == 0

    record = json.loads((docs / "leaderboard" / "costs" / "cnn.json").read_text())
    rows = {row["variant"]: row for row in record["rows"]}
    assert set(rows) == {"nonprivate", "dpsgd"} and record["epsilon"] == 1.0
    assert rows["dpsgd"]["seed"] == 0 and rows["nonprivate"]["seed"] == 2  # each one's first seed
    for variant, lr, clip in (("nonprivate", 1.0, None), ("dpsgd", 0.7, 1.3)):
        row = rows[variant]
        assert row["status"] == "done", row
        results = json.loads((root / row["cell"] / "results.json").read_text())
        assert results["config"]["optimizer"]["lr"] == lr and row["clip_norm"] == clip
        assert row["samples_per_s"] == results["samples_per_s"] and row["peak_memory_mb"] == results["peak_memory_mb"]
        assert row["memory_method"] == results["memory_method"]
        assert row["s_per_step"] == results["step_time_s"]
    dpsgd_results = json.loads((root / rows["dpsgd"]["cell"] / "results.json").read_text())
    assert dpsgd_results["clip_norm"] == 1.3 and dpsgd_results["target_epsilon"] == 1.0  # per run, as the suite's
    assert dpsgd_results["noise_multiplier"] != NOISE
    assert (rows["dpsgd"]["suite_status"], rows["dpsgd"]["suite_noise_multiplier"]) == ("done", NOISE)

    text = (docs / "leaderboard.md").read_text()
    assert text.startswith(BEFORE) and text.endswith(SCALE)
    section = text.split(SECTION_TITLE)[1].split(SCALE_TITLE)[0]
    assert "| method | samples/s | s/step | step vs DP-SGD | peak MB |" in section
    assert "; peak: the working set, malloc's bytes in use at their peak." in section
    dpsgd = _row(section, "DP-SGD")
    assert dpsgd[3] == "1.00x" and dpsgd[5] == "0.200" and dpsgd[6] == "1.00x" and dpsgd[7] == "450 |"
    nonprivate = _row(section, "non-private")
    expected = rows["nonprivate"]["s_per_step"] / rows["dpsgd"]["s_per_step"]
    assert nonprivate[3] == f"{expected:.2f}x" and nonprivate[6] == "0.25x"

    # The ViT runs no cell at the costs' budget for DP-SGD: its lowest budget's, labelled; JL, which the suite refused,
    # is not run: its reason in the columns.
    assert main([*argv[:-1], "vit"]) == 0
    vit = {row["variant"]: row for row in json.loads((docs / "leaderboard" / "costs" / "vit.json").read_text())["rows"]}
    assert vit["dpsgd"]["status"] == "done" and vit["dpsgd"]["epsilon"] == 8.0
    assert json.loads((root / vit["dpsgd"]["cell"] / "results.json").read_text())["target_epsilon"] == 8.0
    assert vit["jl_r1"]["status"] == "refused" and vit["jl_r1"]["reason"] == REFUSAL and vit["jl_r1"]["cell"] is None
    assert not (root / "vit" / "jl_r1").exists()
    text = (docs / "leaderboard.md").read_text()
    assert _row(text, "DP-SGD (at epsilon 8)")[3] == "1.00x"
    refused = next(line for line in text.splitlines() if line.startswith("| JL (r=1) |"))
    assert refused.count("|") == 9 and refused.startswith(
        "| JL (r=1) | refused: privacy.epsilon=1 at delta=1e-06 is unreachable for this run even with noise multiplier "
        "1000 | | |")

    assert main(argv) == 0  # recorded cells are not run again, and the section is replaced, not repeated
    again = (docs / "leaderboard.md").read_text()
    assert again.count(SECTION_TITLE) == 1 and again.endswith(SCALE)
    assert _row(again, "DP-SGD") == _row(text, "DP-SGD") and _row(again, "JL (r=1)") == _row(text, "JL (r=1)")

    # A report built from the recost's own cells: their cells.csv names the same points but not the suite cells' noise
    # (these calibrated their own), so the record, which measured those cells, is listed as stale.
    rebuilt = build(load_suite("tiny", tmp_path / "suite.yaml"), root, docs, "pytest").read_text()
    section = rebuilt.split(SECTION_TITLE)[1]
    assert "| DP-SGD |" not in section and "DP-SGD's cell has another status or noise multiplier" in section


def _failed_record(lr=0.7, commit="abc", epsilon=1.0, **suite_cell):
    """A record whose DP-SGD re-run failed, of the suite's cell (seed 0 at epsilon 1: done, noise NOISE)."""
    row = {"variant": "dpsgd", "label": "DP-SGD", "status": "failed", "epsilon": 1.0, "lr": lr, "clip_norm": 1.3,
           "reason": "RuntimeError: a | in it", "suite_status": "done", "suite_noise_multiplier": NOISE, **suite_cell}
    return {"task": "cnn", "title": "tiny CNN", "commit": commit, "started": "now", "device": "CPU",
            "epsilon": epsilon, "launcher": "fork", "rows": [row]}


def test_the_section_goes_before_the_claims_at_scale_or_at_the_end_and_keeps_what_follows(tmp_path):
    docs = _docs(tmp_path, [row for row in CHOSEN if row[:2] == ("cnn", "dpsgd")])
    (docs / "leaderboard" / "costs").mkdir()
    (docs / "leaderboard" / "costs" / "cnn.json").write_text(json.dumps(_failed_record()))
    (docs / "leaderboard.md").write_text(BEFORE + "\n## Other\n\nkept\n")
    text = rewrite(docs, ["cnn"], 1.0).read_text()
    assert text.startswith(BEFORE + "\n## Other\n\nkept\n\n" + SECTION_TITLE)
    assert "| DP-SGD | failed: RuntimeError: a / in it | | | | 0.200 | 1.00x | 450 |" in text  # cells.csv's medians
    (docs / "leaderboard.md").write_text(text + "## Later\n\nalso kept\n")
    assert rewrite(docs, ["cnn"], 1.0).read_text() == text + "## Later\n\nalso kept\n"


def test_a_record_of_an_earlier_choice_or_of_a_task_the_profile_does_not_run_shows_no_figures(tmp_path):
    """A re-chosen learning rate leaves the record measuring cells the report no longer shows: it is named stale, its
    figures left out; a task outside the profile is left out whole."""
    docs = _docs(tmp_path, [row for row in CHOSEN if row[:2] == ("cnn", "dpsgd")])
    costs = docs / "leaderboard" / "costs"
    costs.mkdir()
    (costs / "cnn.json").write_text(json.dumps(_failed_record(lr=4.0, commit="old1234")))
    (costs / "lstm.json").write_text(json.dumps({**_failed_record(), "task": "lstm", "title": "BiLSTM"}))
    text = rewrite(docs, ["cnn", "vit"], 1.0).read_text()
    assert "RuntimeError" not in text and "BiLSTM" not in text and "lstm" not in text
    assert ("- `cnn` (commit old1234, now): DP-SGD's chosen learning rate, clip norm or budget changed since; run "
            "`python -m dpbench.leaderboard --recost cnn`") in text
    (costs / "cnn.json").write_text(json.dumps(_failed_record()))
    assert "RuntimeError" in rewrite(docs, ["cnn", "vit"], 1.0).read_text()
    for record, reason in (
            (_failed_record(suite_noise_multiplier=1.9), "DP-SGD's cell has another status or noise multiplier"),
            (_failed_record(suite_status="refused"), "DP-SGD's cell has another status or noise multiplier"),
            (_failed_record(epsilon=8.0), "it measured the cells at epsilon 8; the report's costs are at 1"),
            ({**_failed_record(), "rows": [{key: value for key, value in _failed_record()["rows"][0].items()
                                            if not key.startswith("suite_")}]},
             "it was measured before records kept the suite cell's noise multiplier and status")):
        (costs / "cnn.json").write_text(json.dumps(record))
        text = rewrite(docs, ["cnn", "vit"], 1.0).read_text()
        assert "RuntimeError" not in text and f"- `cnn` (commit abc, now): {reason}" in text


@pytest.mark.parametrize(("methods", "meaning"), [
    (["working set: malloc's bytes in use"], "peak: the working set, malloc's bytes in use at their peak"),
    (["cuda.max_memory_reserved"], "peak: CUDA max_memory_reserved"),
    (["working set: malloc's bytes in use", "cuda.max_memory_reserved"],
     "peak: measured differently by its runs (each cell's results.json names how)"),
    ([None], "peak: the resident high-water mark above the process's start"),
], ids=["CPU", "CUDA", "mixed", "before runs named it"])
def test_a_record_says_what_its_peak_measured(methods, meaning):
    record = {"rows": [{"status": "done", "memory_method": method} for method in methods]}
    assert _peak_meaning(record) == meaning


def test_under_a_total_budget_recost_runs_at_the_suites_calibrated_noise(tmp_path, monkeypatch, clean_commit):
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    docs, root = _docs(tmp_path, [row for row in CHOSEN if row[:2] == ("cnn", "dpsgd")]), tmp_path / "costs"
    assert main(_argv(tmp_path, docs, "cnn", TOTAL)) == 0
    row, = json.loads((docs / "leaderboard" / "costs" / "cnn.json").read_text())["rows"]
    results = json.loads((root / row["cell"] / "results.json").read_text())
    assert row["status"] == "done" and results["noise_multiplier"] == NOISE and results["target_epsilon"] is None

    unnoised = _docs(tmp_path / "unnoised", [("cnn", "dpsgd", "dpsgd", "done", 0, "1.0", 0.7, 1.3, "", "")])
    assert main(_argv(tmp_path, unnoised, "cnn", TOTAL)) == 2  # a total's cell without its sigma is not guessed


@pytest.mark.parametrize(("tasks", "chosen", "extra", "message"), [
    ("cnn,nope", CHOSEN, [], "--recost nope: not a task of the tiny profile (its tasks: cnn, vit"),
    ("absent", CHOSEN, [], "--recost absent: skipped: /nonexistent/fashion-mnist does not exist"),
    ("cnn", None, [], "cells.csv does not exist"),
    ("vit", [("cnn", *CHOSEN[2][1:])], [], "--recost vit: "),
    ("cnn", [("cnn", "dpsgd", "dpsgd", "done", 0, "1.0", 0.7, "", 0.1, 400.0)], [],
     "the cells.csv row of dpsgd (seed 0) has no clip_norm"),
    ("cnn", CHOSEN, ["--dry-run"], "--recost runs cells of its own; it does not combine with --dry-run"),
], ids=["unknown task", "data not installed", "no cells.csv", "no test cell of the task", "a private row without clip",
        "with --dry-run"])
def test_what_recost_cannot_do_it_refuses_in_one_line(tmp_path, capsys, tasks, chosen, extra, message):
    docs = _docs(tmp_path, chosen) if chosen is not None else tmp_path / "docs"
    assert main([*_argv(tmp_path, docs, tasks), *extra]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(("measured", "roots"), [("abc", 1), ("abc-dirty", 2)], ids=["committed", "edited"])
def test_an_edited_tree_is_measured_afresh_each_time(tmp_path, monkeypatch, measured, roots):
    """Cells are reused only for the same commit: an edited tree's earlier cells measured other code."""
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr("dpbench.leaderboard.__main__.commit", lambda: measured)
    docs = _docs(tmp_path, [(*CHOSEN[-1][:3], "done", *CHOSEN[-1][4:])])  # its re-run is refused at once: quick
    monkeypatch.chdir(tmp_path)
    argv = [arg for arg in _argv(tmp_path, docs, "vit") if arg not in ("--root", str(tmp_path / "costs"))]
    assert main(argv) == 0
    assert main(argv) == 0
    made = sorted(path.name for path in (tmp_path / "outputs" / "leaderboard" / "costs").iterdir())
    assert len(made) == roots and all(name.startswith(measured) for name in made), made
