"""Ctrl-C or SIGTERM stops a sweep, through the CLI: the job in flight checkpoints, no other job starts, the report of
what finished is written, and the same command with the printed hydra.sweep.dir and resume=auto continues it."""

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.cli import FAST, ROOT, results

SWEEP = ["-m", "seed=0,1,2", "max_steps=30", "batch_size=100", "trainer.checkpoint_every_n_steps=2", *FAST]


def _start(sweep_dir: Path) -> subprocess.Popen:
    """In a session of its own, as a terminal's job is its own process group."""
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-m", "dpbench", *SWEEP, f"hydra.sweep.dir={sweep_dir}"], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _wait_for(process: subprocess.Popen, path_pattern: str, sweep_dir: Path) -> None:
    deadline = time.time() + 240
    while time.time() < deadline and process.poll() is None:
        if list(sweep_dir.glob(path_pattern)):
            return
        time.sleep(0.01)
    pytest.fail(f"the sweep ended or stalled before {path_pattern} appeared")


def _continue_command(stderr: str) -> list[str]:
    found = re.search(r"rerun the same command with (hydra\.sweep\.dir=.*? resume=auto)", stderr)
    assert found, stderr[-3000:]
    return shlex.split(found.group(1))


def test_ctrl_c_mid_job_stops_the_sweep_and_the_same_command_continues_it(tmp_path):
    sweep = tmp_path / "sweep"
    process = _start(sweep)
    _wait_for(process, "1_*/checkpoints/last.ckpt", sweep)  # job 0 finished, job 1 in training
    os.killpg(process.pid, signal.SIGINT)
    stdout, stderr = process.communicate(timeout=240)
    assert process.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert re.search(r"stopped by SIGINT after step \d+", stderr), stderr[-3000:]
    assert "dpbench sweep summary (1 run)" in stdout and (sweep / "report.md").exists()
    assert not (sweep / "1_vanilla" / "results.json").exists() and not (sweep / "2_vanilla").exists()
    finished = (sweep / "0_vanilla" / "results.json").read_bytes()

    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    again = subprocess.run([sys.executable, "-m", "dpbench", *SWEEP, *_continue_command(stderr)], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (sweep / "0_vanilla" / "results.json").read_bytes() == finished  # kept as it was
    resumed = results(sweep / "1_vanilla")
    assert resumed["steps"] == 30 and 0 < resumed["resumed_from_step"] < 30
    assert results(sweep / "2_vanilla")["steps"] == 30 and results(sweep / "2_vanilla")["resumed_from_step"] is None
    assert "dpbench sweep summary (3 runs)" in again.stdout


@pytest.mark.parametrize("signum,to_group", [(signal.SIGINT, True), (signal.SIGTERM, False)],
                         ids=["ctrl-c-to-the-group", "sigterm-to-the-sweep-process"])
def test_a_signal_while_a_job_starts_stops_the_sweep(tmp_path, signum, to_group):
    """Sent before the job's process has set up its handlers, the signal still stops it, and no other job starts."""
    sweep = tmp_path / "sweep"
    process = _start(sweep)
    _wait_for(process, "0_*", sweep)
    (os.killpg if to_group else os.kill)(process.pid, signum)
    stdout, stderr = process.communicate(timeout=240)
    assert process.returncode == 128 + signum, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert f"sweep stopped by {signal.Signals(signum).name}" in stderr and "resume=auto" in stderr
    assert not (sweep / "1_vanilla").exists() and not (sweep / "0_vanilla" / "results.json").exists()
