"""The CPU working set (dpbench/profiling/working_set.py), through a real Trainer and the run's own profiler: it
counts a 100 MB tensor a step holds, within a few percent, and not memory freed before the step's peak; it does not
move with what the allocator keeps of freed memory (the resident figure does)."""

import json

import lightning as L
import pytest
import torch
from omegaconf import OmegaConf

from dpbench.core.optim import OptimizerConfig
from dpbench.privacy.ledger import PrivacyLedger
from dpbench.privacy.randomness import PrivacyRandomness
from dpbench.privatizers import PrivacySettings, make_strategy
from dpbench.profiling import ProfilerCallback
from dpbench.profiling.working_set import in_use_bytes
from dpbench.training.datamodule import DPDataModule
from dpbench.training.module import DPModule
from tests.helpers.cli import FAST, dpbench
from tests.helpers.trainer_run import IndexModel, index_data

HELD_MB, FREED_MB = 100, 60

pytestmark = pytest.mark.skipif(in_use_bytes() is None, reason="glibc's mallinfo2 is missing")


HELD: list[torch.Tensor] = []
"""Outside the model, whose own state a step may not change (dpbench.training.step refuses that)."""


class HoldsTensors(IndexModel):
    """Each training forward first allocates and frees FREED_MB, then allocates HELD_MB and keeps it until the next
    step (held across the step's backward and update)."""

    def forward(self, x):
        if self.training:
            HELD.clear()
            freed = torch.ones(FREED_MB * 2**20 // 4)
            del freed
            HELD.append(torch.ones(HELD_MB * 2**20 // 4))
        return super().forward(x)


def test_the_working_set_counts_what_a_step_holds_and_not_what_it_freed_before():
    torch.manual_seed(0)
    data, randomness, batch_size = index_data(200), PrivacyRandomness(0), 50
    strategy = make_strategy(OmegaConf.create({"name": "vanilla", "engine": "functorch"}),
                             PrivacySettings(1.0, batch_size / len(data.train), 1.0, randomness))
    module = DPModule(HoldsTensors(), data.task, strategy, OptimizerConfig(name="sgd", lr=0.1), PrivacyLedger(1e-5),
                      batch_size)
    profiler = ProfilerCallback(warmup_steps=3, expected_batch_size=batch_size)
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=-1, max_steps=6, logger=False, callbacks=[profiler], enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
        use_distributed_sampler=False,
    )
    trainer.fit(module, datamodule=DPDataModule(data, batch_size, "poisson", randomness, eval_batch_size=64))
    assert len(profiler.step_working_sets) == 3  # the warm-up steps only: the timed ones run without the reads
    assert HELD_MB <= profiler.working_set_mb <= HELD_MB * 1.05, profiler.step_working_sets
    assert profiler.peak_mb == profiler.working_set_mb and "working set" in profiler.memory_method


def test_a_run_reports_the_same_working_set_whatever_the_allocator_keeps(tmp_path):
    """Same batches (an explicit privacy seed), the allocator keeping freed memory or not: the working set is the
    same to 1%, the resident peak is not the working set. A first run times the CNN's per-sample rules into its own
    cache, so that neither compared run is the one that times them (that adds 0.4 MB to its working set)."""
    out, cache = {}, {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    for keep in ("warm-up", "true", "false"):
        kept = "false" if keep == "false" else "true"
        run = dpbench("max_steps=6", "batch_size=500", "privacy.seed=7", "trainer.checkpoint=false",
                      f"trainer.keep_freed_host_memory={kept}", *FAST, f"hydra.run.dir={tmp_path / keep}", env=cache)
        assert run.returncode == 0, run.stderr[-2000:]
        out[keep] = json.loads((tmp_path / keep / "results.json").read_text())
    working = [out[keep]["peak_memory_mb"] for keep in ("true", "false")]
    assert abs(working[0] - working[1]) <= 0.01 * max(working), working
    assert all(out[keep]["memory_method"].startswith("working set") and out[keep]["resident_peak_mb"] > 0
               for keep in ("true", "false"))
