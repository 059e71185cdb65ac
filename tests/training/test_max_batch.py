"""Max-batch search: the doubling/bisection logic, real trial processes under a resident-memory cap, the separate
memory measures a trial records, and a cap below the interpreter's own footprint."""

import json
import os
import re
import subprocess
import sys

import pytest

from dpbench.app import max_batch
from dpbench.app.max_batch import Trial, find_max_batch, run_trial
from dpbench.core.errors import ConfigurationError
from dpbench.report.build import build_report
from tests.helpers.cli import ROOT

TINY = ["data=digits", "model=cnn_large", "model.width=8", "model.hidden=8"]


@pytest.fixture
def fake_trials(monkeypatch):
    """run_trial replaced by a capacity rule: batches up to `capacity` fit; the setup needs `footprint` MB."""
    def install(capacity, footprint=300.0, cap_mb=1000.0):
        def fake_trial(overrides, batch_size, cap, steps=2, device=None):
            if footprint > cap:
                return Trial(batch_size, False, cap + 1, None, stage="setup", reason="resident memory passed the cap")
            fits = batch_size <= capacity
            return Trial(batch_size, fits, footprint + batch_size, footprint, float(batch_size) if fits else None,
                         "VmHWM above VmRSS at start" if fits else "", "" if fits else "steps",
                         "" if fits else "resident memory passed the cap")

        monkeypatch.setattr(max_batch, "run_trial", fake_trial)
        monkeypatch.setattr(max_batch, "trial_device", lambda overrides: "cpu")
        return cap_mb

    return install


@pytest.mark.parametrize("capacity", [8, 100, 1000, 4097])
def test_search_finds_the_largest_fitting_batch(fake_trials, capacity):
    cap = fake_trials(capacity)
    result = find_max_batch(["privatizer=vanilla"], cap_mb=cap, start=8, resolution=0.0)
    assert result.max_batch_size == capacity and result.note == ""
    sizes = [t.batch_size for t in result.trials]
    doubling = [s for s in sizes if s & (s - 1) == 0]
    assert doubling == [8 * 2**k for k in range(len(doubling))]  # doubling first, then bisection
    assert len(sizes) <= 2 * capacity.bit_length() + 2


@pytest.mark.parametrize("capacity", [0, 1, 5])
def test_search_goes_below_the_start_when_the_start_fails_in_its_steps(fake_trials, capacity):
    cap = fake_trials(capacity)
    result = find_max_batch(["privatizer=vanilla"], cap_mb=cap, start=8, resolution=0.0)
    assert result.max_batch_size == capacity
    assert ("out of memory at batch 1" in result.note) == (capacity == 0)


def test_a_cap_below_the_setup_footprint_is_refused_with_the_footprint(fake_trials):
    cap = fake_trials(100, footprint=420.0, cap_mb=50.0)
    with pytest.raises(ConfigurationError, match=r"--cap-mb 50 is below .* about 428 MB .* above 428"):
        find_max_batch(["privatizer=vanilla"], cap_mb=cap, start=8)  # the probe: 420 setup + 8 for its batch


def test_a_trial_records_the_process_footprint_apart_from_the_steps_peak():
    trial = run_trial([*TINY, "privatizer=vanilla"], 16, cap_mb=8000)
    assert trial.fits and trial.stage == ""
    assert trial.steps_peak_method.endswith("above VmRSS at start")
    # the whole process (Python, torch, data, model) against the two steps' own peak above their start
    assert trial.setup_rss_mb > 100 and trial.process_peak_rss_mb >= 0.9 * trial.setup_rss_mb
    assert 0 <= trial.steps_peak_mb < trial.setup_rss_mb / 4


def test_a_cpu_cap_is_compared_with_the_working_set_not_the_resident_size():
    """The same trial under a cap above its working set fits; under one just below it, it does not, though its
    resident size (libraries' pages, memory the allocator keeps) is larger than either and no guard stopped it."""
    free = run_trial([*TINY, "privatizer=vanilla"], 16, cap_mb=8000)
    assert free.fits and 0 < free.working_set_mb < free.process_peak_rss_mb
    capped = run_trial([*TINY, "privatizer=vanilla"], 16, cap_mb=0.9 * free.working_set_mb)
    assert not capped.fits and capped.stage == "steps" and "working set" in capped.reason
    assert capped.working_set_mb == pytest.approx(free.working_set_mb, rel=0.05)
    roomy = run_trial([*TINY, "privatizer=vanilla"], 16, cap_mb=1.1 * free.working_set_mb)
    assert roomy.fits and roomy.process_peak_rss_mb > roomy.working_set_mb


@pytest.mark.parametrize("privatizer", ["sparse", "d2p2"])
def test_a_trial_prepares_what_the_run_fixes_before_its_first_step(privatizer):
    """Sparse's selection budget and D2P2's noise schedule come from prepare(); a trial that skipped it crashed."""
    setting = ["model=word2vec", "data=bbc_news", "data.train_size=2000", "privacy.epsilon=30"] \
        if privatizer == "sparse" else TINY
    trial = run_trial([*setting, f"privatizer={privatizer}"], 8, cap_mb=8000, steps=3)  # the third is timed
    assert trial.fits and trial.samples_per_s


def test_a_trial_at_bf16_mixed_steps_as_a_run_does_and_refuses_a_privatizer_without_it():
    """The frontier measures at trainer.precision: its trial steps through the run's private-step precision context
    (autocast for the forwards only), and a privatizer without mixed precision is refused as a run refuses it."""
    trial = run_trial([*TINY, "privatizer=vanilla", "trainer.precision=bf16-mixed"], 8, cap_mb=8000, steps=3)
    assert trial.fits and trial.samples_per_s
    with pytest.raises(ConfigurationError, match="privatizer=jl does not support trainer.precision=bf16-mixed"):
        run_trial([*TINY, "privatizer=jl", "trainer.precision=bf16-mixed"], 8, cap_mb=8000)


def test_a_cap_below_the_interpreter_is_an_error_naming_the_footprint(tmp_path):
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "dpbench.capacity", "max_batch", "--cap-mb", "50", "--privatizers", "vanilla",
         "--out", str(tmp_path), *TINY], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-3000:]
    line = run.stderr.strip().splitlines()[-1]
    needed = float(re.search(r"about (\d+) MB", line).group(1))
    assert line.startswith("dpbench.capacity: error: --cap-mb 50 is below") and needed > 100
    assert not (tmp_path / "max_batch.json").exists()  # no "max batch 0" on record


def test_report_includes_max_batch_results(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "results.json").write_text(json.dumps({
        "privatizer": "vanilla", "model": "cnn", "data": "mnist5k", "epsilon": 3.0, "batch_size": 64,
        "test_metric": "accuracy", "test_accuracy": 0.9, "samples_per_s": 100.0, "peak_memory_mb": 10.0,
        "config": {"privatizer": {"name": "vanilla"}},
    }))
    trials = [Trial(8, True, 410.0, 380.0, 2.0), Trial(16, False, 501.0, 395.0, stage="steps", reason="cap")]
    result = max_batch.MaxBatchResult(["model=cnn"], 500.0, "cpu", 1234, max_batch.cap_applies_to("cpu"), "",
                                      trials)
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "max_batch.json").write_text(json.dumps(
        {"memory_fields_mb": max_batch.MEMORY_FIELDS, "results": [{"privatizer": "vanilla", **result.to_dict()}]}))
    (tmp_path / "max_batch.json").write_text(json.dumps([  # written before the fields were split
        {"privatizer": "jl", "cap_mb": 700.0, "device": "cpu", "max_batch_size": 99, "overrides": []},
    ]))
    text = build_report([tmp_path])["markdown"].read_text()
    assert "| vanilla | model=cnn | cpu | 500 | 1234 | 395 |  |" in text
    assert "| jl |  | cpu | 700 | 99 | - |  |" in text
