"""The profiler measures the method, not the run's accounting: the epoch end's epsilon is computed outside its
memory and time window, through a real Trainer and a fresh `python -m dpbench` process (issue 24 item 6)."""

import time

import lightning as L
import numpy as np
import torch
from omegaconf import OmegaConf

from dpbench.core.optim import OptimizerConfig
from dpbench.privacy.accountant import PrivacyAccountant
from dpbench.privacy.ledger import PrivacyLedger
from dpbench.privacy.randomness import PrivacyRandomness
from dpbench.privatizers import PrivacySettings, make_strategy
from dpbench.profiling import ProfilerCallback
from dpbench.training.callbacks import EpsilonLogger
from dpbench.training.datamodule import DPDataModule
from dpbench.training.module import DPModule
from tests.helpers.cli import FAST, dpbench, results
from tests.helpers.trainer_run import IndexModel, index_data

SCRATCH_MB = 256
PAUSE_S = 1.0


def test_epoch_end_accounting_is_outside_the_profilers_memory_and_time(monkeypatch):
    """Every epsilon the run computes (the coarse per-epoch one and the ledger's own at the last epoch) holds 256 MB
    of resident scratch for a second; none of it reaches the profiler's peak memory or step time."""
    profiler = ProfilerCallback(warmup_steps=0)
    paused_during_accounting = []
    epsilon = PrivacyAccountant.epsilon

    def costly_epsilon(self, composition, delta):
        scratch = np.ones(SCRATCH_MB * 2**20 // 8)  # written, so resident
        paused_during_accounting.append(getattr(profiler.memory, "paused", False))
        time.sleep(PAUSE_S)
        del scratch
        return epsilon(self, composition, delta)

    monkeypatch.setattr(PrivacyAccountant, "epsilon", costly_epsilon)
    torch.manual_seed(0)
    data, randomness, batch_size = index_data(200), PrivacyRandomness(0), 50
    strategy = make_strategy(OmegaConf.create({"name": "vanilla"}),
                             PrivacySettings(1.0, batch_size / len(data.train), 1.0, randomness))
    ledger = PrivacyLedger(1e-5)
    module = DPModule(IndexModel(), data.task, strategy, OptimizerConfig(name="sgd", lr=0.1), ledger, batch_size)
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=-1, max_steps=12, logger=False, callbacks=[profiler, EpsilonLogger(ledger)],
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        limit_val_batches=0, use_distributed_sampler=False,
    )
    trainer.fit(module, datamodule=DPDataModule(data, batch_size, "poisson", randomness, eval_batch_size=64))

    assert len(ledger.epsilon_history) == 3 and len(paused_during_accounting) == 3  # 3 epochs of 4 steps
    assert all(paused_during_accounting)
    assert profiler.memory.peak_mb < SCRATCH_MB / 2, profiler.memory.peak_mb
    assert not profiler.memory.paused
    assert profiler.measured_steps == 12 and profiler.total_train_time < PAUSE_S * 3 / 2  # the pauses alone: 3 s


WORD2VEC = ["model=word2vec", "data=bbc_news", "model.init_std=1.0", "optimizer=adam", "batch_size=200",
                   "data.train_size=2000", "epochs=2", "privacy.noise_multiplier=1.0", "privacy.delta=1e-6",
                   "trainer.num_threads=1", "trainer.checkpoint=false", "profiler.warmup_steps=2", *FAST]


def test_sparse_word2vec_peak_memory_is_its_own(tmp_path):
    """A fresh process each: sparse at 40,000 draws a step (2,327 atoms in its accountant's PRV, whose cdf once took
    about 900 MB at the epoch ends of this run) reports a peak near DP-SGD's on the same model and data."""
    outs = {}
    for name, privatizer in (("sparse", ["privatizer=sparse", "privatizer.sparsity=0.2", "privatizer.clip2=10.0",
                                         "privatizer.draw_epsilon=0.0036"]),
                             ("vanilla", ["privatizer=vanilla"])):
        run = dpbench(*WORD2VEC, *privatizer, f"hydra.run.dir={tmp_path / name}", timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        outs[name] = results(tmp_path / name)
        assert outs[name]["steps"] == 20 and outs[name]["accountant_method"] == "prv"
    assert outs["sparse"]["selection_draws"] == 40_000
    peaks = {name: out["peak_memory_mb"] for name, out in outs.items()}
    assert peaks["sparse"] < peaks["vanilla"] + 100, peaks


def test_a_runs_training_time_leaves_out_its_per_epoch_accounting(tmp_path, monkeypatch, compose):
    """Through the CLI's run: two epoch ends each spend slow_s in the accountant (D2P2's twelve noise buckets took
    0.6 s an epoch on the CNN here, more than its steps); train_time_s leaves that out, epsilon_log_time_s says it."""
    from dpbench.app.run import run_experiment

    slow_s, epsilon = 5.0, PrivacyAccountant.epsilon
    fit_started, fit_seconds = [], []

    def slow_epsilon(self, composition, delta):
        if fit_started:
            time.sleep(slow_s)
        return epsilon(self, composition, delta)

    monkeypatch.setattr(PrivacyAccountant, "epsilon", slow_epsilon)
    def timed_fit(trainer, *args, fit=L.Trainer.fit, **kwargs):
        fit_started.append(True)
        start = time.perf_counter()
        try:
            return fit(trainer, *args, **kwargs)
        finally:
            fit_seconds.append(time.perf_counter() - start)

    monkeypatch.setattr(L.Trainer, "fit", timed_fit)
    cfg = compose(["model=cnn", "data=mnist5k", "batch_size=1500", "max_steps=6", "privacy.noise_multiplier=1.0",
                   "logger.wandb=false", "logger.csv=false", "trainer.enable_progress_bar=false",
                   "trainer.checkpoint=false", "trainer.check_val_every_n_epoch=null", "eval_batch_size=1000"])
    out = run_experiment(cfg, tmp_path)
    assert out.epochs == 2
    assert out.epsilon_log_time_s >= 2 * slow_s
    # the fit spent both epoch ends' 2 * slow_s beside its steps: a training time that held them would exceed this
    assert 0 < out.train_time_s < fit_seconds[0] - 2 * slow_s + 0.5
