"""Runs interrupted at any point mid-training resume to exactly the uninterrupted run, through the CLI.

The kill lands after a periodic checkpoint and before the end: the steps between that checkpoint and the kill run
again with the same batches and noise (both keyed by the step), so the final weights, steps, epsilon and the CSV
history all equal the uninterrupted run's.
"""

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dpbench.training.checkpoint_io import load_checkpoint
from tests.helpers.cli import FAST, ROOT, dpbench, final_weights, results

STEPS = 40
ARGS = [  # explicit privacy seed: reproducible, so the resumed weights can be compared bit for bit
    f"max_steps={STEPS}", "batch_size=400", "privacy.epsilon=4", "privacy.seed=7", "trainer.log_every_n_steps=1",
    "logger.train_stats=true",
    "trainer.checkpoint_every_n_steps=4", "trainer.check_val_every_n_epoch=2", *FAST,
]


def _history(run_dir: Path) -> list[dict[str, str]]:
    """The CSV's rows in file order (training, per-epoch evaluation and epsilon), without the timing columns."""
    with (run_dir / "csv" / "metrics.csv").open(newline="") as handle:
        return [{key: value for key, value in row.items() if not key.startswith("profile/")}
                for row in csv.DictReader(handle)]


def _steps_logged(run_dir: Path) -> int:
    return max(int(row["step"]) for row in _history(run_dir) if row["train/batch_size"]) + 1


def _checkpoint_steps(run_dir: Path) -> list[int]:
    return [int(step) for step in re.findall(r"checkpoint at step (\d+)", (run_dir / "dpbench.log").read_text())]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("reference")
    run = dpbench(*ARGS, f"hydra.run.dir={run_dir}")
    assert run.returncode == 0, run.stderr[-3000:]
    return run_dir


def _start(run_dir: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "dpbench", *ARGS, *extra, f"hydra.run.dir={run_dir}"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )


def _wait_for_checkpoint(process: subprocess.Popen, run_dir: Path, after_step: int) -> None:
    log, deadline = run_dir / "dpbench.log", time.time() + 240
    while time.time() < deadline and process.poll() is None:
        if log.exists() and any(step >= after_step for step in _checkpoint_steps(run_dir)):
            return
        time.sleep(0.02)
    pytest.fail("the run ended or stalled before its mid-training checkpoint")


def _wait_for_checkpoint_file(process: subprocess.Popen, run_dir: Path) -> None:
    """In a fresh job process Hydra's log file is not written: watch the checkpoint itself."""
    checkpoint, deadline = run_dir / "checkpoints" / "last.ckpt", time.time() + 240
    while time.time() < deadline and process.poll() is None:
        if checkpoint.exists():
            return
        time.sleep(0.02)
    pytest.fail("the run ended or stalled before its first checkpoint")


def _checkpoint_step(run_dir: Path) -> int:
    return load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["dpbench_run"]["step"]


def _assert_resumes_to_reference(run_dir: Path, reference: Path, killed_at: int, args: tuple[str, ...] = ARGS) -> None:
    assert not (run_dir / "results.json").exists()
    resumed = dpbench(*args, "resume=true", f"hydra.run.dir={run_dir}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected, got = results(reference), results(run_dir)
    assert got["steps"] == expected["steps"] == STEPS
    assert got["resumed_from_step"] is not None and 0 < got["resumed_from_step"] < STEPS
    assert got["resumed_from_step"] <= killed_at
    assert got["epsilon"] == pytest.approx(expected["epsilon"], rel=1e-9)
    assert got["test_accuracy"] == expected["test_accuracy"]
    assert torch.equal(final_weights(run_dir), final_weights(reference))
    assert _history(run_dir) == _history(reference)  # kept, appended, never duplicated or lost
    ledger, expected_ledger = (json.loads((d / "privacy_ledger.json").read_text()) for d in (run_dir, reference))
    assert ledger == expected_ledger  # every step accounted once, every epoch's epsilon entry present


@pytest.mark.parametrize("cadence", [4, 10], ids=["mid-epoch", "epoch-end"])
def test_sigkill_mid_training_resumes_to_the_uninterrupted_run(tmp_path, reference, cadence):
    """Epochs have 10 steps: a cadence of 4 checkpoints mid-epoch (and at step 20), of 10 at epoch ends only."""
    process = _start(tmp_path, f"trainer.checkpoint_every_n_steps={cadence}")
    _wait_for_checkpoint(process, tmp_path, after_step=8)
    time.sleep(0.3)  # let it run past the checkpoint: those steps must run again, identically
    process.kill()
    process.wait()
    steps_reached = _steps_logged(tmp_path)
    print(f"SIGKILL after step {steps_reached} (last checkpoint at step {_checkpoint_steps(tmp_path)[-1]})")
    assert steps_reached < STEPS
    _assert_resumes_to_reference(tmp_path, reference, steps_reached)


@pytest.mark.parametrize("signum,extra", [(signal.SIGINT, ()), (signal.SIGTERM, ("profiler.fresh_process=always",))])
def test_stop_signal_checkpoints_at_the_step_boundary_and_exits(tmp_path, reference, signum, extra):
    process = _start(tmp_path, *extra)
    _wait_for_checkpoint_file(process, tmp_path)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signum, stderr[-3000:]
    stopped = re.search(rf"stopped by {signal.Signals(signum).name} after step (\d+)", stderr)
    assert stopped, stderr[-2000:]
    step = int(stopped.group(1))
    assert _checkpoint_step(tmp_path) == step  # the checkpoint is the step it stopped at
    assert step < STEPS
    _assert_resumes_to_reference(tmp_path, reference, step)


def test_resume_continues_the_saved_config_without_the_original_overrides(tmp_path, reference):
    """`resume=true hydra.run.dir=X` alone, as the README writes it: the checkpoint's config (its explicit
    privacy.seed apart, never saved: the checkpoint's root continues) is what the run continues."""
    process = _start(tmp_path)
    _wait_for_checkpoint(process, tmp_path, after_step=8)
    time.sleep(0.3)
    process.kill()
    process.wait()
    _assert_resumes_to_reference(tmp_path, reference, _steps_logged(tmp_path), args=())
    assert results(tmp_path)["config"]["privacy"]["seed"] == "<secret>"
    assert results(tmp_path)["privacy_seed"] == "explicit (secret, not recorded)"


@pytest.mark.parametrize("checkpoint", [True, False], ids=["checkpointed", "no-checkpoint"])
def test_resuming_a_finished_run_changes_nothing(tmp_path, checkpoint):
    args = ("max_steps=4", "batch_size=500", "privacy.epsilon=4", f"trainer.checkpoint={checkpoint}", *FAST)
    finished = dpbench(*args, f"hydra.run.dir={tmp_path}")
    assert finished.returncode == 0, finished.stderr[-2000:]
    files = {path: path.read_bytes() for path in tmp_path.rglob("*")  # Hydra's own files apart
             if path.is_file() and ".hydra" not in path.parts and path.name != "dpbench.log"}
    for resume in (("resume=true",), (*args, "resume=auto")):  # alone, and as a continued sweep's job retypes it
        again = dpbench(*resume, f"hydra.run.dir={tmp_path}")
        assert again.returncode == 0, again.stderr[-2000:]
        assert f"the run in {tmp_path} is finished (4 steps)" in again.stdout, again.stdout[-2000:]
        assert {path: path.read_bytes() for path in files} == files  # results, CSV, ledger, checkpoint untouched


def test_resume_true_without_a_checkpoint_is_an_error_and_auto_starts(tmp_path):
    missing = dpbench("max_steps=2", "resume=true", f"hydra.run.dir={tmp_path / 'a'}", *FAST)
    assert missing.returncode == 2
    assert "resume=true but there is no checkpoint" in missing.stderr and "resume=auto" in missing.stderr
    started = dpbench("max_steps=2", "resume=auto", f"hydra.run.dir={tmp_path / 'b'}", *FAST)
    assert started.returncode == 0, started.stderr[-2000:]
    assert results(tmp_path / "b")["steps"] == 2 and results(tmp_path / "b")["resumed_from_step"] is None


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04 torn in the middle of a write"])
def test_corrupt_checkpoint_is_one_clear_line_and_changes_nothing(tmp_path, content):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(content)
    (tmp_path / "csv").mkdir()
    history = tmp_path / "csv" / "metrics.csv"
    history.write_text("epoch,step,train/batch_size\n0,0,411\n")
    run = dpbench("max_steps=2", "resume=true", f"hydra.run.dir={tmp_path}", *FAST)
    assert run.returncode == 2
    error_lines = [line for line in run.stderr.splitlines() if line.startswith("dpbench: error:")]
    assert len(error_lines) == 1 and "last.ckpt cannot be read" in error_lines[0], run.stderr[-2000:]
    assert "Traceback" not in run.stderr
    assert history.read_text() == "epoch,step,train/batch_size\n0,0,411\n"


def test_a_changed_run_is_refused_and_changes_nothing(tmp_path):
    short = dpbench("epochs=2", "batch_size=500", "privacy.seed=5", f"hydra.run.dir={tmp_path}", *FAST)
    assert short.returncode == 0, short.stderr[-2000:]
    planned, history = results(tmp_path), (tmp_path / "csv" / "metrics.csv").read_bytes()
    for change, named in [("privatizer=d2p_sgd", "privatizer.name: vanilla -> d2p_sgd"),
                          ("privacy.seed=6", "privacy.seed")]:  # the last is refused while restoring the checkpoint
        refused = dpbench("epochs=2", "batch_size=500", "privacy.seed=5", change, "resume=true",
                          f"hydra.run.dir={tmp_path}", *FAST)
        assert refused.returncode == 2, refused.stderr[-2000:]
        assert named in refused.stderr and "Traceback" not in refused.stderr, refused.stderr[-2000:]
        assert (tmp_path / "csv" / "metrics.csv").read_bytes() == history and results(tmp_path) == planned


def test_a_changed_schedule_is_refused_unless_the_run_is_extended(tmp_path):
    short = dpbench("epochs=2", "batch_size=500", f"hydra.run.dir={tmp_path}", *FAST)
    assert short.returncode == 0, short.stderr[-2000:]
    planned = results(tmp_path)
    refused = dpbench("epochs=4", "batch_size=500", "resume=true", f"hydra.run.dir={tmp_path}", *FAST)
    assert refused.returncode == 2
    assert "epochs: 2 -> 4" in refused.stderr and "extend_run=true" in refused.stderr
    assert results(tmp_path) == planned  # refused before anything was written

    extended = dpbench("epochs=4", "batch_size=500", "resume=true", "extend_run=true", f"hydra.run.dir={tmp_path}",
                       *FAST)
    assert extended.returncode == 0, extended.stderr[-2000:]
    got = results(tmp_path)
    assert got["steps"] == 2 * planned["steps"] and got["epochs"] == 4
    assert got["noise_multiplier"] == planned["noise_multiplier"]  # not recalibrated mid-run
    assert got["extended_run"]["target_epsilon"] == 3.0
    assert got["epsilon"] > 3.0 and got["extended_run"]["target_exceeded"] is True


@pytest.mark.slow  # W&B's offline init costs ~10 s per run
def test_resume_continues_the_same_wandb_run(tmp_path):
    env = {"WANDB_MODE": "offline"}
    first = dpbench("max_steps=3", "epochs=1", f"hydra.run.dir={tmp_path}", *FAST, env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    run_id = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")["dpbench_run"]["wandb_id"]
    again = dpbench("max_steps=5", "epochs=1", "resume=true", "extend_run=true", f"hydra.run.dir={tmp_path}", *FAST,
                    env=env)  # a finished run is left as it is: extending it is what continues its W&B run
    assert again.returncode == 0, again.stderr[-2000:]
    runs = sorted(path.name for path in (tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(name.endswith(run_id) for name in runs)
