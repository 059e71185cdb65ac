"""A run keeps the host memory its steps free: in steady state a step faults in no memory (training/host_memory.py).

Under glibc's own thresholds some processes give freed blocks back at every step and fault them in again: fixed-size
DP-SGD steps on the CNN faulted 53-252 pages a step in such CLI runs, and 9,300 with +40% step time in the benchmark's
processes. A fixed trim threshold alone is worse (every block above 128 KiB mapped afresh, 21,700 faults a step).
"""

import mmap
import platform

import lightning as L
import pytest

from dpbench.privacy.randomness import PrivacyRandomness
from dpbench.profiling import ProfilerCallback
from tests.helpers.cli import FAST, dpbench, results
from tests.helpers.trainer_run import fit, index_data

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


class FaultAt(L.Callback):
    """At the given steps, inside the profiler's window, writes 8 MiB of a fresh mapping in small pages: 2,048 faults a
    step, as the allocator's giving back does at every step and something outside the method once in a CI run."""

    def __init__(self, steps: set[int]):
        self.steps = steps

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step in self.steps:
            with mmap.mmap(-1, 8 << 20) as fresh:
                fresh.madvise(mmap.MADV_NOHUGEPAGE)
                fresh.write(b"\1" * (8 << 20))


@glibc
@pytest.mark.parametrize(("steps", "faulting"), [({5}, False), (set(range(12)), True), (set(range(0, 12, 3)), True)],
                         ids=["a one-off", "every step", "every third step"])
def test_the_figure_shows_steps_that_fault_again_and_again_but_not_a_one_off(steps, faulting):
    profiler = ProfilerCallback(warmup_steps=1)  # the first step sets things up once
    fit(index_data(200), 50, 13, PrivacyRandomness(0), callbacks=(profiler, FaultAt({step + 1 for step in steps})))
    assert len(profiler.faults_each_step) == 12
    assert sum(profiler.faults_each_step) > 2000 * len(steps), profiler.faults_each_step
    if faulting:
        assert profiler.page_faults_per_step > 500, profiler.faults_each_step
    else:  # the one-off's 2,000+ faults in the mean of all 12 steps would exceed 160; an ordinary step faults 10-150
        assert profiler.page_faults_per_step < 100, profiler.faults_each_step
