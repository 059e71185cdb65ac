"""A researcher's first hour, through the CLI: a method label that is what ran (or a refusal), plans that refuse what
runs refuse, errors that keep the key, memory estimated before the kernel finds it, one voice per process group,
resumes that say so, and the small things (run directories, counts, unmeasured throughput)."""

import json
import os
import resource
import subprocess
import sys

import pytest

from tests.helpers.cli import FAST, ROOT, dpbench, plan, results

SHORT = ("max_steps=2", "batch_size=500", "trainer.checkpoint=false", *FAST)


def _refused(run: subprocess.CompletedProcess) -> str:
    assert run.returncode == 2, run.stderr[-2000:]
    lines = [line for line in run.stderr.splitlines() if line.startswith("dpbench: error:")]
    assert len(lines) == 1, run.stderr[-2000:]
    return lines[0]


@pytest.mark.parametrize(("overrides", "says"), [
    (["privatizer=grape", "optimizer=adam"], "projects no weight of this model at privatizer.rank=32"),
    (["privatizer=dp_galore", "optimizer=adam"], "projects no weight of this model"),
    (["privatizer=jl", "privatizer.projections=100000"], "is not below the model's"),
    (["privatizer=d2p2", "privatizer.dim=1000000"], "the projection reduces nothing"),
    (["privatizer=sparse", "privatizer.sparsity=1", "optimizer=adam"], "selects all"),
])
def test_a_method_that_would_not_be_itself_on_the_model_is_refused_by_run_and_plan(tmp_path, overrides, says):
    message = _refused(dpbench(*overrides, *SHORT, f"hydra.run.dir={tmp_path}"))
    assert says in message
    planned = plan(*overrides)
    assert planned.returncode == 2 and says in planned.stdout + planned.stderr
    assert not (tmp_path / "results.json").exists()


def test_results_record_what_the_method_did_and_its_label_names_the_variant(tmp_path):
    run = dpbench("privatizer=grape", "optimizer=adam", "privatizer.rank=8", *SHORT, f"hydra.run.dir={tmp_path}")
    assert run.returncode == 0, run.stderr[-2000:]
    out = results(tmp_path)
    details = out["method_details"]
    assert details["rank"] == 8 and details["projected"]["classifier.0.weight"] == [32, 512]
    assert details["projected_parameters"] + details["exact_parameters"] == out["trainable_parameters"]
    assert out["method"] == "DP-GRAPE (Adam) (rank=8, F=100)" and "rank=8" in run.stdout


def test_plan_refuses_the_jobs_a_sweep_would_refuse_and_a_refused_job_makes_no_wandb_run(tmp_path):
    planned = plan("-m", "privatizer=vanilla,grape")
    lines = planned.stdout.splitlines()
    assert any("DP-SGD" in line and "sigma=" in line for line in lines)
    assert any("privatizer=grape" in line and "refused" in line and "optimizer=adam" in line for line in lines)
    refused = dpbench("privatizer=grape", "logger.wandb=true", *SHORT, f"hydra.run.dir={tmp_path}",
                      env={"WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    assert "use optimizer=adam" in _refused(refused)
    assert not list(tmp_path.rglob("offline-run-*")) and not (tmp_path / "wandb").exists()


def test_errors_keep_the_key_and_the_line(tmp_path):
    experiments = tmp_path / "conf" / "experiment"
    experiments.mkdir(parents=True)
    (experiments / "my_typo.yaml").write_text("# @package _global_\nprivacy:\n  epsilom: 2\n")
    (experiments / "nested.yaml").write_text("# @package _global_\nmodel:\n  lora:\n    rnk: 4\n")
    typo = _refused(dpbench("--config-dir", str(tmp_path / "conf"), "+experiment=my_typo", *SHORT))
    assert "privacy.epsilom" in typo and "did you mean privacy.epsilon" in typo and "my_typo" in typo
    nested = _refused(dpbench("--config-dir", str(tmp_path / "conf"), "model=minilm", "+experiment=nested", *SHORT))
    assert "model.lora.rnk" in nested and "did you mean model.lora.rank" in nested
    normalization = _refused(dpbench("model=cnn_large", "model.normalization=batch", *SHORT))
    assert "did you mean model.normalization=batchnorm" in normalization
    assert "privatizer=nonprivate" in _refused(dpbench("privacy.epsilon=inf", *SHORT))
    text_on_images = _refused(dpbench("model=opt", *SHORT))
    assert "text model" in text_on_images and "data=rotten_tomatoes" in text_on_images


def _limited_plan(limit_bytes: int, *overrides: str) -> subprocess.CompletedProcess:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (limit_bytes, resource.RLIM_INFINITY))

    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "dpbench.plan", *overrides], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300, preexec_fn=limit)


def test_memory_is_estimated_before_training_and_a_run_that_cannot_fit_names_the_micro_batch_that_does():
    """Materialized per-sample gradients of the 0.5M-parameter CNN at 4000 samples need about 260 GB: refused under a
    4 GB data-segment limit, naming physical_batch_size; at that micro-batch the plan goes through. The limit, far
    below the test machines' free memory, alone bounds the plan: free memory that moves between the plans cannot."""
    heavy = ("model=cnn_large", "batch_size=4000", "privatizer.engine=materialized", "trainer.accelerator=cpu")
    refused = _limited_plan(4 * 2**30, *heavy)
    assert "refused: this run needs about" in refused.stdout, refused.stdout + refused.stderr
    fitting = int(refused.stdout.split("physical_batch_size=")[1].split()[0])
    assert 1 <= fitting < 4000
    fits = _limited_plan(4 * 2**30, *heavy, f"physical_batch_size={fitting}")
    assert fits.returncode == 0 and "memory: about" in fits.stdout and "refused" not in fits.stdout, fits.stdout
    assert f"at {fitting} samples; evaluation" in fits.stdout and f"at {fitting})" in fits.stdout


@pytest.mark.parametrize(("overrides", "evaluation"), [
    (["batch_size=250"], 250),
    (["batch_size=250", "physical_batch_size=100"], 100),
    (["batch_size=250", "eval_batch_size=64"], 64),
])
def test_evaluation_batches_follow_the_training_micro_batch_unless_set(overrides, evaluation):
    planned = plan(*overrides)
    assert planned.returncode == 0, planned.stderr
    assert "; evaluation" in planned.stdout and f" at {evaluation})" in planned.stdout


def test_a_resume_says_where_it_continues_and_a_moved_checkpoint_says_why(tmp_path):
    args = ("batch_size=1000", "privacy.noise_multiplier=1", "privacy.epsilon=null",
            "trainer.checkpoint_every_n_steps=4", *FAST, f"hydra.run.dir={tmp_path}")
    first = dpbench("max_steps=5", *args)
    assert first.returncode == 0, first.stderr[-2000:]
    log = (tmp_path / "dpbench.log").read_text()
    assert "checkpoint at step 5 (due at step 4, an epoch's last step" in log  # 4 steps an epoch at batch 1000
    resumed = dpbench("max_steps=7", "resume=true", "extend_run=true", *args)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resuming the run in {tmp_path} from step 5 of 7" in resumed.stdout


def test_small_things(tmp_path):
    run = dpbench("privatizer=jl_r20", "max_steps=2", "batch_size=500", "trainer.checkpoint=false", *FAST,
                  f"hydra.run.dir={tmp_path}/run")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "DP-SGD-JL (r=20)" in run.stdout
    assert "not measured: the profile leaves out the first profiler.warmup_steps=5 steps" in run.stdout
    default_dir = dpbench("privatizer=jl_r20", "max_steps=1", "batch_size=500", "trainer.checkpoint=false", *FAST,
                          f"hydra.run.dir={tmp_path}/named/${{now:%H-%M-%S}}_${{hydra:runtime.choices.privatizer}}")
    assert default_dir.returncode == 0 and list((tmp_path / "named").glob("*_jl_r20"))
    config = (ROOT / "conf" / "config.yaml").read_text()
    assert "_${hydra:runtime.choices.privatizer}" in config and "_${privatizer.name}" not in config
    report = subprocess.run([sys.executable, "-m", "dpbench.report", str(tmp_path / "run")], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert report.returncode == 0 and "\n1 run; wrote" in report.stdout, report.stdout + report.stderr
    listed = subprocess.run([sys.executable, "-m", "dpbench.components", "data"], cwd=ROOT, capture_output=True,
                            text=True, timeout=300).stdout
    owners, entry = [], None
    for line in listed.splitlines():
        if line.startswith("  ") and not line.startswith("   "):  # an entry; its keys follow, indented further
            entry = line.split()[0]
        if "fashion_mnist_dir" in line:
            owners.append(entry)
    assert owners == ["fashion_mnist"], listed


@pytest.mark.skipif((os.cpu_count() or 1) > 2, reason="the warning is for more ranks than cores: this machine has "
                    "more than 2")
def test_a_process_group_speaks_once_warns_past_the_cores_and_reports_every_ranks_peak(tmp_path):
    run = dpbench("trainer.accelerator=cpu", "trainer.devices=3", "trainer.strategy=ddp", "max_steps=2",
                  "batch_size=300", "trainer.checkpoint=false", *FAST, f"hydra.run.dir={tmp_path}", timeout=600,
                  fresh_interpreter=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("dpbench run summary") == 1
    assert (run.stdout + run.stderr).count("starts 3 training processes on this machine's") == 1
    out = json.loads((tmp_path / "results.json").read_text())
    assert len(out["rank_peak_memory_mb"]) == 3
    assert out["peak_memory_mb"] == pytest.approx(sum(out["rank_peak_memory_mb"]))


def test_the_estimate_counts_projected_adams_moments_in_the_projected_space():
    """DP-GRAPE's Adam keeps its moments in the rank-r space: its estimate's optimizer state is below DP-Adam's."""
    figures = {}
    for privatizer in ("vanilla", "grape"):
        planned = plan("+experiment=grape_memory", f"privatizer={privatizer}", "batch_size=32")
        assert planned.returncode == 0, planned.stdout + planned.stderr
        figures[privatizer] = float(planned.stdout.split("optimizer ")[1].split(",")[0].replace(",", ""))
    assert 0 < figures["grape"] < 0.5 * figures["vanilla"], figures
