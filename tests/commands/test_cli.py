"""The CLI end to end: a short run, a named experiment, a two-job multirun, and the errors users must get."""

import csv

import pytest

from tests.helpers.cli import FAST, dpbench, results

SCHEMA = {
    "privatizer", "model", "data", "epsilon", "delta", "noise_multiplier", "batch_size", "sampling_rate",
    "train_size", "steps", "test_accuracy", "test_metric", "samples_per_s", "peak_memory_mb",
    "max_memory_reserved_mb", "device", "config", "sampling", "accountant_method",
}


def test_short_private_run_writes_honest_results(tmp_path):
    run = dpbench("max_steps=12", "batch_size=200", "privacy.epsilon=2", "profiler.warmup_steps=2",
                  f"hydra.run.dir={tmp_path}", *FAST)
    assert run.returncode == 0, run.stderr[-3000:]
    out = results(tmp_path)
    assert SCHEMA <= set(out)
    assert out["privatizer"] == "vanilla" and out["model"] == "cnn" and out["data"] == "mnist5k"
    assert out["parameters"] == out["trainable_parameters"] == 26_010  # the TF-Privacy CNN (Abadi et al.'s count)
    assert out["steps"] == 12 and out["train_size"] == 4000 and out["sampling"] == "poisson"
    assert out["sampling_rate"] == pytest.approx(200 / 4000)
    assert 1.98 <= out["epsilon"] <= 2.0 and out["accountant_method"] == "prv"
    assert out["noise_multiplier"] > 0.3 and out["delta"] == 1e-5
    assert 0.0 <= out["test_accuracy"] <= 1.0 and out["samples_per_s"] > 0 and out["peak_memory_mb"] > 0
    assert out["max_memory_reserved_mb"] is None and out["device"] == "cpu"
    assert out["config"]["privacy"]["epsilon"] == 2
    assert "dpbench run summary" in run.stdout
    assert (tmp_path / "checkpoints" / "last.ckpt").exists()
    assert (tmp_path / "csv" / "metrics.csv").exists()


def test_named_experiment_and_shuffled_sampling_is_recorded(tmp_path):
    run = dpbench("+experiment=dpsgd_mnist5k", "max_steps=3", "privacy.sampling=shuffle",
                  "trainer.checkpoint=false", f"hydra.run.dir={tmp_path}", *FAST)
    assert run.returncode == 0, run.stderr[-3000:]
    out = results(tmp_path)
    assert out["config"]["experiment_name"] == "dpsgd_mnist5k" and out["batch_size"] == 500
    assert out["sampling"] == "shuffle" and "accounting_note" in out


def test_two_job_multirun_writes_one_result_per_job(tmp_path):
    run = dpbench("-m", "privatizer=nonprivate,vanilla", "max_steps=4", "batch_size=100", "profiler.warmup_steps=1",
                  "trainer.checkpoint=false", f"hydra.sweep.dir={tmp_path}", *FAST)
    assert run.returncode == 0, run.stderr[-3000:]
    jobs = sorted(p for p in tmp_path.iterdir() if (p / "results.json").exists())
    assert [results(p)["privatizer"] for p in jobs] == ["nonprivate", "vanilla"]
    nonprivate, vanilla = (results(p) for p in jobs)
    assert nonprivate["epsilon"] is None and nonprivate["noise_multiplier"] is None
    assert vanilla["epsilon"] <= 3.0 and vanilla["noise_multiplier"] > 0
    assert all(results(p)["peak_memory_mb"] > 0 for p in jobs)
    # the Hydra callback wrote the sweep report with each job's own figures
    assert "dpbench sweep summary (2 runs)" in run.stdout
    with (tmp_path / "report.csv").open() as handle:
        rows = {row["label"]: row for row in csv.DictReader(handle)}
    assert set(rows) == {"non-private SGD", "DP-SGD"}  # the method with its optimizer
    for job in (nonprivate, vanilla):
        row = rows[job["method"]]
        assert float(row["test_value"]) == pytest.approx(job["test_accuracy"])
        assert float(row["samples_per_s"]) == pytest.approx(job["samples_per_s"])
        assert float(row["peak_memory_mb"]) == pytest.approx(job["peak_memory_mb"])
    assert float(rows["DP-SGD"]["epsilon"]) == pytest.approx(vanilla["epsilon"])
    assert rows["non-private SGD"]["epsilon"] == ""
    assert {"metric_vs_epsilon.png", "samples_per_s.png"} <= {p.name for p in tmp_path.iterdir()}


@pytest.mark.parametrize(
    "override,message",
    [
        ("privacy.epsion=3", "epsion"),
        ("privacy.epsilon=-1", "privacy.epsilon must be a positive"),
        ("privacy.epsilon=0.001", "unreachable"),
        ("privatizer.engin=hooks", "engin"),
        ("privacy.delta=2", "delta must lie in"),
        ("data=nope", "nope"),
    ],
)
def test_bad_input_fails_before_training_with_a_clear_error(tmp_path, override, message):
    run = dpbench(override, "max_steps=2", f"hydra.run.dir={tmp_path}", *FAST)
    assert run.returncode != 0
    assert message in run.stderr
    assert not (tmp_path / "results.json").exists()


def test_batchnorm_model_is_refused(tmp_path):
    run = dpbench("model=cnn_large", "model.normalization=batchnorm", "model.width=16", "model.hidden=8",
                  "max_steps=2", f"hydra.run.dir={tmp_path}", *FAST)
    assert run.returncode == 2
    assert "BatchNorm2d" in run.stderr and "GroupNorm" in run.stderr
