"""A run killed with SIGKILL and resumed with resume=true ends exactly like an uninterrupted run."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.cli import FAST, ROOT, dpbench, results

ARGS = ["epochs=5", "batch_size=400", "privacy.epsilon=4", "privacy.seed=7", *FAST]  # explicit: reproducible


def test_killed_and_resumed_run_matches_an_uninterrupted_one(tmp_path):
    reference_dir, resumed_dir = tmp_path / "reference", tmp_path / "resumed"
    reference = dpbench(*ARGS, f"hydra.run.dir={reference_dir}")
    assert reference.returncode == 0, reference.stderr[-3000:]

    env = {**os.environ, "WANDB_MODE": "disabled"}
    process = subprocess.Popen(
        [sys.executable, "-m", "dpbench", *ARGS, f"hydra.run.dir={resumed_dir}"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    checkpoint = resumed_dir / "checkpoints" / "last.ckpt"
    deadline = time.time() + 240
    while not checkpoint.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    if process.poll() is not None:
        pytest.fail("the run ended before it could be killed: make it longer")
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (resumed_dir / "results.json").exists()

    resumed = dpbench(*ARGS, "resume=true", f"hydra.run.dir={resumed_dir}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected, got = results(reference_dir), results(resumed_dir)
    assert got["steps"] == expected["steps"] == 5 * 10
    assert got["epsilon"] == pytest.approx(expected["epsilon"], rel=1e-9)
    assert got["test_accuracy"] == pytest.approx(expected["test_accuracy"])
