"""A method is named with its optimizer wherever a user reads it: the run summary, results.json, the sweep report and
`dpbench.plan`; a privatizer run with an optimizer its paper does not use says so in the log and the label."""

import re

import pytest

from tests.helpers.cli import FAST, plan, results
from tests.helpers.cli import dpbench as run_cli

D2P2_VARIANT = " (p=1024, decay=inverse_sqrt)"  # the keys that make it a variant, in every label
LABELS = {("vanilla", "sgd"): "DP-SGD", ("vanilla", "adam"): "DP-Adam", ("d2p2", "sgd"): "D2P2-SGD" + D2P2_VARIANT,
          ("d2p2", "adam"): "D2P2-Adam (paper: SGD)" + D2P2_VARIANT}


def test_summary_results_and_sweep_report_name_the_method_with_its_optimizer(tmp_path):
    run = run_cli("-m", "privatizer=vanilla,d2p2", "optimizer=sgd,adam", "max_steps=2", "batch_size=500",
                  "trainer.checkpoint=false", "profiler.fresh_process=never", f"hydra.sweep.dir={tmp_path}", *FAST)
    assert run.returncode == 0, run.stderr[-3000:]
    jobs = {(out["privatizer"], out["optimizer"]): out for out in map(results, tmp_path.glob("*_*/"))}
    assert {key: out["method"] for key, out in jobs.items()} == LABELS
    for label in LABELS.values():  # each run's one-screen summary, and a row of the sweep's table
        assert re.search(rf"^run +{re.escape(label)} \(privatizer=", run.stdout, re.MULTILINE), run.stdout[-3000:]
        assert f"| {label} " in (tmp_path / "report.md").read_text()
    warned = re.findall(r"privatizer=(\w+) with optimizer=(\w+): its paper's method uses optimizer=(\w+)",
                        run.stdout + run.stderr)
    assert sorted(set(warned)) == [("d2p2", "adam", "sgd")]


def test_plan_names_the_method_with_its_optimizer():
    out = plan("-m", "privatizer=vanilla,nonprivate", "optimizer=adam", "max_steps=2")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "DP-Adam (privatizer=vanilla) on mnist5k" in out.stdout
    assert "non-private Adam (privatizer=nonprivate) on mnist5k" in out.stdout
    grape = plan("privatizer=grape", "privatizer.rank=8", "optimizer=adam", "max_steps=2")
    assert grape.returncode == 0, grape.stderr[-2000:]
    assert "DP-GRAPE (Adam) (rank=8, F=100) (privatizer=grape) on mnist5k" in grape.stdout


@pytest.mark.slow  # W&B's offline init costs ~10 s
def test_wandb_run_is_named_and_tagged_with_the_method(tmp_path):
    run = run_cli("max_steps=2", "optimizer=adam", "trainer.checkpoint=false", f"hydra.run.dir={tmp_path}", *FAST,
                  env={"WANDB_MODE": "offline"})
    assert run.returncode == 0, run.stderr[-2000:]
    (record,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    raw = record.read_bytes()  # the run record's strings are stored as they are, near the file's start
    assert b"DP-Adam-cnn-mnist5k-eps3-b500-lr0.001-s0" in raw  # the display name
    assert all(tag in raw for tag in (b"DP-Adam", b"vanilla", b"optimizer=adam"))
