"""Ledger file, stop_on_budget, secure noise, and the out-of-memory route."""

import json

import pytest
import torch
from omegaconf import OmegaConf
from scipy import stats

from dpbench.app.run import run_experiment
from dpbench.core.errors import ConfigurationError
from dpbench.privacy import PrivacyAccountant, SubsampledGaussian
from dpbench.privacy.randomness import PrivacyRandomness, PrivateStream
from dpbench.privatizers import PrivacySettings, make_strategy
from dpbench.privatizers.base import StepContext
from dpbench.privatizers.per_sample import HookEngine
from dpbench.training.module import DPModule
from tests.helpers.cli import FAST, dpbench, results


def test_secure_noise_is_standard_normal_and_leaves_torch_rngs_alone():
    state = torch.get_rng_state()
    sample = PrivacyRandomness(1, secure=True).draws("noise", 0).normal((20001,), torch.float64).numpy()
    assert torch.equal(torch.get_rng_state(), state)
    assert stats.kstest(sample, "norm").pvalue > 1e-3
    noise = PrivateStream(PrivacyRandomness(secure=True), "noise")
    first, second = noise.normal_like(torch.zeros(1000), 2.0), noise.normal_like(torch.zeros(1000), 2.0)
    assert not torch.equal(first, second) and float(first.std()) == pytest.approx(2.0, rel=0.15)
    uniforms = PrivacyRandomness(1, secure=True).draws("sampling", 0).uniform(20001).numpy()
    assert stats.kstest(uniforms, "uniform").pvalue > 1e-3


def test_stop_on_budget_trains_only_the_steps_the_budget_covers(tmp_path):
    sigma, budget, q = 1.0, 3.0, 200 / 4000
    run = dpbench("max_steps=200", "batch_size=200", f"privacy.noise_multiplier={sigma}", f"privacy.epsilon={budget}",
                  "privacy.stop_on_budget=true", "trainer.checkpoint=false", f"hydra.run.dir={tmp_path}", *FAST)
    assert run.returncode == 0, run.stderr[-3000:]
    out = results(tmp_path)
    steps = out["steps"]
    assert out["stopped_on_budget"] and out["planned_steps"] == 200 and 0 < steps < 200
    assert out["epsilon"] <= budget
    one_more = PrivacyAccountant().epsilon([(SubsampledGaussian(q, sigma), steps + 1)], 1e-5).epsilon
    assert one_more > budget
    ledger = json.loads((tmp_path / "privacy_ledger.json").read_text())
    assert ledger["steps"] == steps and ledger["mechanisms"][-1]["last_step"] == steps - 1
    assert ledger["mechanisms"][0]["mechanism"] == {"kind": "subsampled_gaussian", "sampling_rate": q,
                                                    "noise_multiplier": sigma}
    assert ledger["mechanisms"][0]["strategy"] == "vanilla"
    assert ledger["epsilon_spent"][-1] == {"steps": steps, "epsilon": out["epsilon"]}  # the final, exact figure


def test_out_of_memory_suggests_micro_batches(tmp_path, monkeypatch, compose):
    def out_of_memory(self, batch, batch_idx):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(DPModule, "training_step", out_of_memory)
    cfg = compose(["max_steps=2", "logger.wandb=false", "trainer.enable_progress_bar=false"])
    with pytest.raises(ConfigurationError, match="physical_batch_size=125"):
        run_experiment(cfg, tmp_path)


@pytest.mark.parametrize("name", ["vanilla", "jl", "grape", "dp_galore", "d2p2", "d2p_sgd", "dp2_sgd"])
def test_a_nan_sample_is_dropped_counted_and_never_poisons_the_update(name, tiny_task):
    model, (inputs, targets) = tiny_task.model, tiny_task.batch
    strategy = make_strategy(OmegaConf.create({"name": name}), PrivacySettings(1.0, 0.1, 1.0))
    strategy.prepare(model, 10, 1e-5, None, PrivacyAccountant())
    strategy.attach(model)
    inputs[3, 0, 0, 0] = float("nan")  # sample B/2: one the hook engine's first-batch check compares
    output = strategy.privatize(model, tiny_task.task, (inputs, targets), StepContext(0, 6.0))
    assert output.stats["nonfinite_samples"] == 1
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    engine = getattr(strategy, "engine", None)
    assert engine is None or isinstance(getattr(engine, "engine", engine), HookEngine)  # the check kept the hooks
