"""W&B runs a sweep's methods can be compared in without hand work, read back from the offline run files."""

import pytest

from tests.helpers.cli import FAST, dpbench, results
from tests.helpers.wandb_records import logged_table, read_offline_run


@pytest.fixture
def offline_wandb(tmp_path):
    """W&B offline, with its staging and cache directories in tmp_path rather than the user's home."""
    return {"WANDB_MODE": "offline", "WANDB_DATA_DIR": str(tmp_path / "wandb_data"),
            "WANDB_CACHE_DIR": str(tmp_path / "wandb_cache"), "WANDB_CONFIG_DIR": str(tmp_path / "wandb_config")}


def test_run_carries_method_sigma_q_steps_and_results_table(tmp_path, offline_wandb):
    run_dir = tmp_path / "run"
    run = dpbench("max_steps=3", "batch_size=250", "optimizer=adam", "optimizer.lr=0.002", "profiler.warmup_steps=1",
                  f"hydra.run.dir={run_dir}", *FAST, env=offline_wandb)
    assert run.returncode == 0, run.stderr[-3000:]
    out, logged = results(run_dir), read_offline_run(run_dir)
    assert logged.job_type == "train" and logged.group == "default"
    assert logged.name == "DP-Adam-cnn-mnist5k-eps3-b250-lr0.002-s0" and "DP-Adam" in logged.tags
    assert logged.config["method"] == "DP-Adam" and logged.config["optimizer"]["lr"] == 0.002
    for key in ("noise_multiplier", "sampling_rate", "steps", "epsilon", "peak_memory_mb", "samples_per_s"):
        assert logged.summary[key] == out[key], key
    assert out["sampling_rate"] == 250 / 4000 and out["steps"] == 3
    assert logged.summary["final/test_accuracy"] == out["test_accuracy"]
    (row,) = logged_table(logged, "results")
    assert {key: row[key] for key in ("method", "epsilon", "noise_multiplier", "steps", "test_accuracy")} == {
        key: out[key] for key in ("method", "epsilon", "noise_multiplier", "steps", "test_accuracy")}
    assert f"wandb sync {logged.directory}" in run.stdout


@pytest.mark.slow  # two jobs, each a fresh process with W&B's offline init
def test_sweep_jobs_share_a_group_of_their_own(tmp_path, offline_wandb):
    sweep = tmp_path / "sweep_a"
    run = dpbench("-m", "privatizer=nonprivate,vanilla", "max_steps=2", "batch_size=250", "profiler.warmup_steps=1",
                  "trainer.checkpoint=false", f"hydra.sweep.dir={sweep}", *FAST, env=offline_wandb)
    assert run.returncode == 0, run.stderr[-3000:]
    jobs = sorted(path for path in sweep.iterdir() if (path / "results.json").exists())
    logged = [read_offline_run(job) for job in jobs]
    assert [entry.group for entry in logged] == ["default/sweep_a"] * 2
    assert [entry.job_type for entry in logged] == ["sweep"] * 2
    assert [entry.config["method"] for entry in logged] == ["non-private SGD", "DP-SGD"]
    assert logged[0].summary["noise_multiplier"] is None and logged[1].summary["noise_multiplier"] > 0
