"""Every sweep config in sweeps/ composes; the Optuna sweep tunes on a validation split, never the test split."""

from pathlib import Path

import pytest

from tests.helpers.cli import FAST, ROOT, dpbench, results

SWEEPS = sorted(p.stem for p in (ROOT / "sweeps").glob("*.yaml"))


@pytest.mark.parametrize("name", SWEEPS)
def test_sweep_config_composes(name):
    run = dpbench("--config-dir", "sweeps", "--config-name", name, "--cfg", "all")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "sweeper:" in run.stdout and "privacy:" in run.stdout


def test_expected_sweeps_exist():
    assert {"compare_privatizers", "optuna_lr_clip", "slurm"} <= set(SWEEPS)


@pytest.mark.slow  # the README test composes the sweep; this runs it (30 s)
def test_optuna_sweep_runs_and_returns_the_validation_metric(tmp_path: Path):
    run = dpbench("-m", "--config-dir", "sweeps", "--config-name", "optuna_lr_clip", "hydra.sweeper.n_trials=2",
                  "max_steps=3", "batch_size=100", "trainer.checkpoint=false", f"hydra.sweep.dir={tmp_path}", *FAST)
    assert run.returncode == 0, run.stderr[-3000:]
    jobs = [p for p in tmp_path.iterdir() if (p / "results.json").exists()]
    assert len(jobs) == 2
    for job in jobs:
        out = results(job)
        assert out["validation_size"] == 500 and out["train_size"] == 3500
        assert out["validation_accuracy"] is not None
    best = (tmp_path / "optimization_results.yaml").read_text()
    assert "best_value" in best
    assert max(results(job)["validation_accuracy"] for job in jobs) == pytest.approx(
        float(best.split("best_value:")[1].split()[0]))
