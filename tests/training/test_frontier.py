"""The memory/throughput frontier (`python -m dpbench.capacity frontier`): the search's OOM-at-batch-1 rule, a trial
that outgrows its cap failing inside its own process, and the command end to end with its record and figure."""

import json
import os
import signal
import subprocess
import sys

import pytest

from dpbench.app import max_batch
from dpbench.app.frontier import frontier_row
from dpbench.app.max_batch import Trial, find_max_batch
from dpbench.core.errors import ConfigurationError
from tests.helpers.cli import ROOT

TINY = ["data=digits", "model=cnn_large", "model.width=8", "model.hidden=8", "optimizer=adam"]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def model_too_big(monkeypatch):
    """Trials whose model alone passes the cap: each fails before its first step, above the interpreter."""
    tried = []

    def fake_trial(overrides, batch_size, cap, steps=2, device=None):
        tried.append(batch_size)
        return Trial(batch_size, False, cap + 1, None, stage="setup", reason="resident memory passed the cap",
                     interpreter_rss_mb=interpreter)

    interpreter = 400.0
    monkeypatch.setattr(max_batch, "run_trial", fake_trial)
    monkeypatch.setattr(max_batch, "trial_device", lambda overrides: "cpu")
    return tried


def test_a_model_that_does_not_fit_is_out_of_memory_at_batch_1(model_too_big):
    row = frontier_row("vanilla", [], cap_mb=1000.0, fixed_batch=4, limit=64, resolution=1.0, steps=3)
    assert row.out_of_memory_at_1 and row.max_batch_size == 0 and model_too_big == [4, 1]
    assert row.peak_at_fixed_mb is None and row.note.startswith("out of memory at batch 1")


def test_a_cap_below_the_interpreter_is_still_an_error_in_the_frontier(model_too_big, monkeypatch):
    monkeypatch.setattr(max_batch, "footprint_error", lambda *args: ConfigurationError("cap below the footprint"))
    with pytest.raises(ConfigurationError, match="footprint"):
        find_max_batch([], cap_mb=300.0, start=4, model_may_not_fit=True)  # the interpreter alone needs 400


def test_a_cpu_trial_cannot_allocate_far_past_its_cap():
    """The parent polls resident memory every 10 ms, which one large allocation outruns; the trial's data-segment
    limit fails that allocation inside the trial, as an out-of-memory the search records."""
    probe = (
        "import torch\n"
        "from dpbench.app.max_batch import _limit_data_segment, _out_of_memory\n"
        "torch.ones(2**24)\n"  # 64 MB: under the limit
        "_limit_data_segment(500.0)\n"
        "try:\n"
        "    torch.ones(2**28)\n"  # 1 GiB at once: past 500 MB * 1.1 + 512 MB
        "    print('allocated')\n"
        "except Exception as error:\n"
        "    print('out of memory' if _out_of_memory(error) else repr(error))\n"
    )
    run = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.stdout.strip() == "out of memory", run.stdout + run.stderr[-2000:]


def test_the_frontier_command_records_every_method_and_draws_them(tmp_path):
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "dpbench.capacity", "frontier", *TINY, "--privatizers", "nonprivate,materialized,grape",
         "--cap-gb", "4", "--batch", "4", "--limit", "8", "--resolution", "1", "--steps", "3", "--out",
         str(tmp_path), "optimizer=sgd"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    record = json.loads((tmp_path / "frontier.json").read_text())
    rows = {row["privatizer"]: row for row in record["rows"]}
    assert list(rows) == ["nonprivate", "materialized", "grape"]
    for name in ("nonprivate", "materialized"):
        row = rows[name]
        assert row["max_batch_size"] == 8 and [t["batch_size"] for t in row["trials"]] == [4, 8]
        fixed = row["trials"][0]  # the CPU peak is the working set: the process's bytes in use, not its resident size
        assert row["peak_at_fixed_mb"] == fixed["working_set_mb"] > fixed["interpreter_in_use_mb"] > 0
        assert fixed["working_set_mb"] < fixed["process_peak_rss_mb"] and row["interpreter_rss_mb"] > 100
        assert row["samples_per_s_at_fixed"] > 0 and row["samples_per_s_at_max"] > 0
    assert rows["grape"]["refused"] and "optimizer=adam" in rows["grape"]["note"]  # the others still measured
    assert "| grape | refused |" in run.stdout
    assert "[1/3] nonprivate:" in run.stdout and "[3/3] grape (" in run.stdout
    assert "s left at the mean of 2)" in run.stdout
    assert "trial 2 (of at most" in run.stdout and record["in_progress"] is None  # rewritten after every trial
    assert (tmp_path / "frontier.png").read_bytes().startswith(PNG)


def killed_by_the_system(overrides, batch_size, steps, cap_mb, device_name, queue) -> None:
    """A trial body the kernel's OOM killer ends (SIGKILL), as it did at OPT-1.3B with other jobs on the host."""
    queue.put(("interpreter", 400.0))
    queue.close()
    queue.join_thread()  # the feeder thread has sent the message: a real trial is killed long after it
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_trial_killed_by_the_system_is_a_recorded_failure_not_a_crash(monkeypatch):
    monkeypatch.setattr(max_batch, "_train_steps", killed_by_the_system)
    trial = max_batch.run_trial(["privatizer=vanilla"], 4, cap_mb=20480.0, device="cpu")
    assert not trial.fits and trial.stage == "setup" and trial.reason.startswith("killed by the system")
    assert trial.interpreter_rss_mb == 400.0


def test_a_sharded_method_is_measured_by_its_largest_ranks_whole_working_set():
    """`vanilla@2`: each trial is a real 2-rank FSDP2 run; its peak is the largest rank's bytes in use above
    training's start plus what it held then, the same basis as a one-process trial's working set (interpreter,
    data and model included), so the two rows of one frontier compare."""
    one = frontier_row("vanilla", TINY, 4096, 8, 8, 1.0, 3)
    sharded = frontier_row("vanilla@2", TINY, 4096, 8, 8, 1.0, 3)
    assert sharded.privatizer == "vanilla" and sharded.devices == 2 and one.devices == 1
    assert sharded.max_batch_size == 8 and sharded.samples_per_s_at_fixed > 0
    assert 0.5 * one.peak_at_fixed_mb < sharded.peak_at_fixed_mb < 2 * one.peak_at_fixed_mb
    tight = frontier_row("vanilla@2", TINY, 0.8 * sharded.peak_at_fixed_mb, 1, 1, 1.0, 3)  # one trial, batch 1
    assert tight.out_of_memory_at_1 and "largest rank's peak" in tight.trials[-1].reason
    with pytest.raises(ConfigurationError, match="vanilla@4"):
        frontier_row("vanilla@x", TINY, 4096, 8, 8, 1.0, 3)
