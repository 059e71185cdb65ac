"""A run keeps the host memory its steps free: in steady state a step faults in no memory (training/host_memory.py).

Under glibc's own thresholds some processes give freed blocks back at every step and fault them in again: fixed-size
DP-SGD steps on the CNN faulted 53-252 pages a step in such CLI runs, and 9,300 with +40% step time in the benchmark's
processes. A fixed trim threshold alone is worse (every block above 128 KiB mapped afresh, 21,700 faults a step).
"""

import platform

import pytest

from tests.cli import FAST, dpbench, results

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's")
STEADY = ["privacy.sampling=shuffle", "batch_size=250", "max_steps=30", "profiler.warmup_steps=15",
          "trainer.num_threads=1", "trainer.checkpoint=false"]
"""Fixed-size batches (20 a pass over MNIST-5k): after the first pass no step meets a new shape, whose kernels would
be set up (and faulted in) once."""


@glibc
def test_steady_steps_fault_in_no_memory(tmp_path):
    run = dpbench(*STEADY, f"hydra.run.dir={tmp_path}", *FAST)
    assert run.returncode == 0, run.stderr
    out = results(tmp_path)
    assert out["host_memory"].startswith("glibc keeps freed memory"), out["host_memory"]
    assert out["page_faults_per_step"] < 20, out["page_faults_per_step"]


@glibc
def test_the_setting_can_be_turned_off_and_says_so(tmp_path):
    run = dpbench(*STEADY, "trainer.keep_freed_host_memory=false", f"hydra.run.dir={tmp_path}", *FAST)
    assert run.returncode == 0, run.stderr
    out = results(tmp_path)
    assert out["host_memory"] == "allocator defaults"
    assert out["page_faults_per_step"] >= 0
