"""`--recost`: a task's chosen test cells run again on the current code, their costs written beside the cells' own,
and only that section of docs/leaderboard.md rewritten."""

import csv
import json

from dpbench.leaderboard import build, load_suite
from dpbench.leaderboard.__main__ import main
from dpbench.leaderboard.recost import SECTION_TITLE
from dpbench.leaderboard.report import CSV_COLUMNS
from dpbench.leaderboard.scale import SECTION_TITLE as SCALE_TITLE
from tests.test_leaderboard import TINY

CHOSEN = [  # (variant, method, seed, epsilon, lr, clip, s/step, peak MB)
    ("nonprivate", "nonprivate", 3, "", 9.0, "", 0.05, 300.0),
    ("nonprivate", "nonprivate", 2, "", 1.0, "", 0.05, 300.0),
    ("dpsgd", "dpsgd", 0, "1.0", 0.7, 1.3, 0.1, 400.0),
    ("dpsgd", "dpsgd", 1, "1.0", 0.7, 1.3, 0.3, 500.0),
    ("dpsgd", "dpsgd", 0, "8.0", 2.0, 0.5, 0.9, 900.0),  # another budget than the costs': not run
]
BEFORE = "# dpbench leaderboard\n\nThe cells' tables.\n"
SCALE = f"{SCALE_TITLE}\n\nThe frontier records.\n"


def _docs(tmp_path):
    docs = tmp_path / "docs"
    (docs / "leaderboard").mkdir(parents=True)
    with (docs / "leaderboard" / "cells.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for variant, method, seed, epsilon, lr, clip, step, peak in CHOSEN:
            writer.writerow({"task": "cnn", "method": method, "variant": variant, "phase": "test", "status": "done",
                             "target_epsilon": epsilon, "seed": seed, "lr": lr, "clip_norm": clip,
                             "s_per_step": step, "samples_per_s": 100 / step, "peak_memory_mb": peak})
        writer.writerow({"task": "cnn", "method": "dpsgd", "variant": "dpsgd", "phase": "tune", "status": "done",
                         "target_epsilon": "1.0", "seed": 0, "lr": 9.0, "clip_norm": 9.0})
        writer.writerow({"task": "vit", "method": "jl", "variant": "jl_r1", "phase": "test", "status": "refused",
                         "target_epsilon": "1.0", "seed": 0, "lr": 1.0, "clip_norm": 1.0})
    (docs / "leaderboard.md").write_text(BEFORE + "\n" + SCALE)
    return docs


def test_recost_runs_the_chosen_cells_and_rewrites_only_its_section(tmp_path, monkeypatch):
    for key, value in {"WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}.items():
        monkeypatch.setenv(key, value)
    suite, docs, root = tmp_path / "suite.yaml", _docs(tmp_path), tmp_path / "costs"
    suite.write_text(TINY)
    argv = ["--suite", str(suite), "--profile", "tiny", "--docs", str(docs), "--root", str(root), "--recost", "cnn"]
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
        assert row["s_per_step"] == results["step_time_s"]
    assert json.loads((root / rows["dpsgd"]["cell"] / "results.json").read_text())["clip_norm"] == 1.3
    assert rows["dpsgd"]["recorded"] == {"samples_per_s": (100 / 0.1 + 100 / 0.3) / 2, "s_per_step": 0.2,
                                         "peak_memory_mb": 450.0}  # medians over the seeds at the costs' budget

    text = (docs / "leaderboard.md").read_text()
    assert text.startswith(BEFORE) and text.endswith(SCALE)
    section = text.split(SECTION_TITLE)[1].split(SCALE_TITLE)[0].split("### tiny ViT")[0]
    dpsgd = next(line for line in section.splitlines() if line.startswith("| DP-SGD |")).split(" | ")
    assert dpsgd[3] == "1.00x" and dpsgd[5] == "0.200" and dpsgd[6] == "1.00x" and dpsgd[7] == "450 |"
    nonprivate = next(line for line in section.splitlines() if line.startswith("| non-private |")).split(" | ")
    expected = rows["nonprivate"]["s_per_step"] / rows["dpsgd"]["s_per_step"]
    assert nonprivate[3] == f"{expected:.2f}x" and nonprivate[6] == "0.25x"

    assert main([*argv[:-1], "vit"]) == 0  # a refused cell: its row says so, in the table's columns
    refused = json.loads((docs / "leaderboard" / "costs" / "vit.json").read_text())["rows"]
    assert [row["status"] for row in refused] == ["refused"] and "unreachable" in refused[0]["reason"]
    text = (docs / "leaderboard.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| JL (r=1) |"))
    assert row.count("|") == 9 and row.startswith("| JL (r=1) | refused: privacy.epsilon=1 at delta=1e-06 is "
                                                   "unreachable for this run even with noise multiplier 1000 | | |")

    assert main(argv) == 0  # recorded cells are not run again, and the section is replaced, not repeated
    assert (docs / "leaderboard.md").read_text() == text

    rebuilt = build(load_suite("tiny", suite), root, docs, "pytest").read_text()  # the whole report keeps it too
    assert (SECTION_TITLE + section).rstrip() in rebuilt


def test_recost_of_an_unknown_task_or_without_the_cells_csv_is_refused(tmp_path, capsys):
    suite = tmp_path / "suite.yaml"
    suite.write_text(TINY)
    base = ["--suite", str(suite), "--profile", "tiny", "--docs", str(tmp_path / "docs"), "--root", str(tmp_path)]
    assert main([*base, "--recost", "cnn,nope"]) == 2
    assert "--recost nope: not a task of the tiny profile (its tasks: cnn, vit" in capsys.readouterr().err
    assert main([*base, "--recost", "absent"]) == 2
    assert "--recost absent: skipped: /nonexistent/fashion-mnist does not exist" in capsys.readouterr().err
    assert main([*base, "--recost", "cnn"]) == 2
    assert "cells.csv does not exist" in capsys.readouterr().err
