"""Settings that weaken the guarantee are refused or said out loud: a delta at or above 1/N, a fixed noise multiplier
beside a target epsilon, and mixed precision (whose gradient scaler would rescale dpbench's privatized gradients)."""

from __future__ import annotations

import logging

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import dpbench
from dpbench.app import hydra_setup
from dpbench.app.run import prepare_run, run_experiment
from dpbench.core.config import Config, check_run_settings, validated
from dpbench.core.errors import ConfigurationError
from tests.helpers.cli import FAST
from tests.helpers.cli import dpbench as run_cli

MNIST5K = 4000
"""Training samples of the default data set: 1/N = 2.5e-4, 1/N^1.1 = 1.1e-4."""


def _config(*overrides: str):
    return hydra_setup.compose(["max_steps=4", "logger.wandb=false", "trainer.enable_progress_bar=false",
                                "trainer.checkpoint=false", *overrides])


# -- delta against 1/N ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("delta", ["1e-2", f"{1 / MNIST5K}"])
def test_delta_at_or_above_one_over_n_is_refused(delta):
    with pytest.raises(ConfigurationError, match=r"privacy.delta=.* 1/N .*privacy.allow_large_delta=true"):
        prepare_run(_config(f"privacy.delta={delta}"))


def test_delta_refusal_is_one_line_through_the_cli(tmp_path):
    run = run_cli("privacy.delta=0.01", "max_steps=2", f"hydra.run.dir={tmp_path}", *FAST)
    assert run.returncode == 2, run.stderr[-2000:]
    errors = [line for line in run.stderr.splitlines() if line.startswith("dpbench: error:")]
    assert len(errors) == 1 and "privacy.delta=0.01" in errors[0] and "allow_large_delta" in errors[0]
    assert not (tmp_path / "results.json").exists()


@pytest.mark.parametrize("overrides", [["privacy.delta=1e-2", "privacy.allow_large_delta=true"],
                                       ["privacy.delta=2e-4"]])
def test_large_delta_runs_when_allowed_or_below_one_over_n_but_says_so(overrides, caplog):
    with caplog.at_level(logging.WARNING):
        prepared = prepare_run(_config(*overrides))
    assert prepared.plan.private and prepared.plan.noise_multiplier > 0
    assert "privacy.delta" in caplog.text and "1/N" in caplog.text


def test_default_delta_is_quiet(caplog):
    with caplog.at_level(logging.WARNING):
        prepare_run(_config())
    assert "privacy.delta" not in caplog.text


def test_make_private_applies_the_same_delta_rule():
    dataset = TensorDataset(torch.randn(400, 6), torch.randint(0, 2, (400,)))
    model = nn.Linear(6, 2)
    loader = dpbench.poisson_loader(dataset, batch_size=40)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ConfigurationError, match="1/N"):
        dpbench.make_private(model, optimizer, loader, steps=5, target_epsilon=3.0, delta=0.01)
    private = dpbench.make_private(model, optimizer, loader, steps=5, target_epsilon=3.0, delta=0.01,
                                   allow_large_delta=True)
    assert private.plan.delta == 0.01


# -- epsilon beside a fixed noise multiplier -----------------------------------------------------------------------

def test_a_fixed_noise_multiplier_says_it_wins_over_epsilon_in_the_log_and_results(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        out = run_experiment(_config("privacy.noise_multiplier=0.8", "privacy.epsilon=0.5", "batch_size=200"),
                             tmp_path)
    assert out.epsilon > 0.5  # what the fixed noise spends: above the epsilon the config names
    assert out.noise_multiplier == 0.8 and out.target_epsilon is None
    assert out.noise_multiplier_source.startswith("fixed (privacy.noise_multiplier)")
    assert "privacy.epsilon" in out.noise_multiplier_source
    assert "privacy.noise_multiplier=0.8" in caplog.text and "privacy.epsilon=0.5" in caplog.text


@pytest.mark.parametrize("overrides, source", [
    ([], "calibrated to privacy.epsilon"),
    (["privacy.noise_multiplier=1", "privacy.epsilon=null"], "fixed (privacy.noise_multiplier)"),
    (["privacy.noise_multiplier=1", "privacy.stop_on_budget=true"], "privacy.stop_on_budget"),
])
def test_noise_multiplier_source_names_the_setting_that_decided_the_noise(overrides, source):
    from dpbench.privatizers.privacy_plan import noise_multiplier_source

    typed = validated(Config, _config(*overrides), "top-level")
    assert source in noise_multiplier_source(typed.privacy)


def test_make_private_refuses_both_a_target_epsilon_and_a_noise_multiplier():
    model = nn.Linear(6, 2)
    loader = dpbench.poisson_loader(TensorDataset(torch.randn(400, 6), torch.randint(0, 2, (400,))), batch_size=40)
    with pytest.raises(ConfigurationError, match="either target_epsilon or noise_multiplier"):
        dpbench.make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), loader, steps=5,
                             target_epsilon=3.0, noise_multiplier=1.0)


# -- precision -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("precision", ["16", "16-mixed", "bf16", "16-true", "bf16-true"])
def test_fp16_and_half_precision_weights_are_refused_in_one_line(precision):
    typed = validated(Config, _config(f"trainer.precision={precision}"), "top-level")
    with pytest.raises(ConfigurationError, match=f"trainer.precision={precision} .*bf16-mixed, 32-true") as error:
        check_run_settings(typed)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("precision", ["32", "32-true", "64", "64-true", "bf16-mixed"])
def test_full_and_bf16_mixed_precision_are_accepted(precision):
    check_run_settings(validated(Config, _config(f"trainer.precision={precision}"), "top-level"))


def test_own_trainer_with_bf16_weights_is_refused_before_a_step():
    x = torch.randn(300, 6)
    y = (x[:, 0] > 0).long()
    data = dpbench.DataBundle("toy", dpbench.TensorSplit(x[:200], y[:200]), dpbench.TensorSplit(x[200:], y[200:]),
                              num_classes=2)
    module, datamodule = dpbench.make_private_module(nn.Linear(6, 2), data, "vanilla",
                                                     optimizer=dpbench.OptimizerConfig(lr=0.1), batch_size=20,
                                                     steps=3, target_epsilon=3.0)
    trainer = L.Trainer(max_steps=3, accelerator="cpu", precision="bf16-true", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        use_distributed_sampler=False)
    with pytest.raises(ConfigurationError, match="precision"):
        trainer.fit(module, datamodule=datamodule)
    assert module.ledger.steps == 0
