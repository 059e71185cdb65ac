"""A run keeps the host memory its steps free: in steady state a step faults in no memory (training/host_memory.py).

Under glibc's own thresholds some processes give freed blocks back at every step and fault them in again: fixed-size
DP-SGD steps on the CNN faulted 53-252 pages a step in such CLI runs, and 9,300 with +40% step time in the benchmark's
processes. A fixed trim threshold alone is worse (every block above 128 KiB mapped afresh, 21,700 faults a step).
"""

import mmap
import platform

import lightning as L
import pytest
import torch
from omegaconf import OmegaConf

from dpbench.optim import OptimizerConfig
from dpbench.privacy.ledger import PrivacyLedger
from dpbench.privacy.randomness import PrivacyRandomness
from dpbench.privatizers import PrivacySettings, make_strategy
from dpbench.profiling import ProfilerCallback
from dpbench.training.datamodule import DPDataModule
from dpbench.training.module import DPModule
from tests.cli import FAST, dpbench, results
from tests.trainer_run import IndexModel, index_data

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


class FaultInOnce(L.Callback):
    """At one step, inside the profiler's window, writes 8 MiB of a fresh mapping in small pages: 2,048 faults, as
    something outside the method can cause once in a CI run."""

    def __init__(self, at_step: int):
        self.at_step = at_step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.at_step:
            with mmap.mmap(-1, 8 << 20) as fresh:
                fresh.madvise(mmap.MADV_NOHUGEPAGE)
                fresh.write(b"\1" * (8 << 20))


def test_a_one_off_fault_does_not_make_steady_steps_look_faulting():
    """The figure is the typical step's: the allocator's giving back faults at every step, a one-off does not."""
    profiler, one_off = ProfilerCallback(warmup_steps=0), FaultInOnce(at_step=5)
    torch.manual_seed(0)
    data, randomness, batch_size = index_data(200), PrivacyRandomness(0), 50
    strategy = make_strategy(OmegaConf.create({"name": "vanilla"}),
                             PrivacySettings(1.0, batch_size / len(data.train), 1.0, randomness))
    module = DPModule(IndexModel(), data.task, strategy, OptimizerConfig(name="sgd", lr=0.1), PrivacyLedger(1e-5),
                      batch_size)
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=-1, max_steps=12, logger=False, callbacks=[profiler, one_off],
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        limit_val_batches=0, use_distributed_sampler=False,
    )
    trainer.fit(module, datamodule=DPDataModule(data, batch_size, "poisson", randomness, eval_batch_size=64))

    assert profiler.measured_steps == 12
    assert profiler.measured_faults > 20 * 12, profiler.measured_faults  # a mean over the steps would pass 20
    assert profiler.page_faults_per_step < 20, profiler.page_faults_per_step
