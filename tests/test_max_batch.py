"""Max-batch search: the doubling/bisection logic, and real trial processes under a resident-memory cap."""

import json

import pytest

from dpbench.profiling import max_batch
from dpbench.profiling.max_batch import Trial, find_max_batch, run_trial
from dpbench.report.build import build_report

TINY = ["data=digits", "model=cnn_large", "model.width=8", "model.hidden=8"]


@pytest.mark.parametrize("capacity", [8, 100, 1000, 4097])
def test_search_finds_the_largest_fitting_batch(monkeypatch, capacity):
    def fake_trial(overrides, batch_size, cap_mb, steps=2):
        return Trial(batch_size, batch_size <= capacity, float(batch_size))

    monkeypatch.setattr(max_batch, "run_trial", fake_trial)
    result = find_max_batch(["privatizer=vanilla"], cap_mb=1.0, start=8, resolution=0.0)
    assert result.max_batch_size == capacity
    sizes = [t.batch_size for t in result.trials]
    doubling = [s for s in sizes if s & (s - 1) == 0]
    assert doubling == [8 * 2**k for k in range(len(doubling))]  # doubling first, then bisection
    assert len(sizes) <= 2 * capacity.bit_length() + 2


def test_a_trial_fits_under_a_generous_cap_and_is_killed_under_a_tiny_one():
    fits = run_trial([*TINY, "privatizer=vanilla"], 16, cap_mb=8000)
    assert fits.fits and fits.peak_memory_mb > 0
    killed = run_trial([*TINY, "privatizer=vanilla"], 16, cap_mb=50)  # below a Python + torch process
    assert not killed.fits and "cap" in killed.reason


def test_report_includes_max_batch_results(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "results.json").write_text(json.dumps({
        "privatizer": "vanilla", "model": "cnn", "data": "mnist5k", "epsilon": 3.0, "batch_size": 64,
        "test_metric": "accuracy", "test_accuracy": 0.9, "samples_per_s": 100.0, "peak_memory_mb": 10.0,
        "config": {"privatizer": {"name": "vanilla"}},
    }))
    (tmp_path / "max_batch.json").write_text(json.dumps([
        {"privatizer": "vanilla", "cap_mb": 500.0, "device": "cpu", "max_batch_size": 1234, "overrides": []},
    ]))
    report = build_report([tmp_path])
    text = report["markdown"].read_text()
    assert "1234" in text and "500" in text
