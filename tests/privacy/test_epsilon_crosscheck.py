"""The ledger's epsilon is checked against the privatizer's declared composition() for the steps taken: a plugin whose
step_mechanisms() report less than it declared (here: sampling rate 0, i.e. "free" steps) cannot report a smaller
epsilon, at any epsilon() call and at the end of a run (make_private, a Lightning Trainer, the CLI's run)."""

from __future__ import annotations

import json
import logging
import math

import lightning as L
import pytest
import torch
from omegaconf import OmegaConf
from torch import nn
from torch.utils.data import TensorDataset

import dpbench
from dpbench.app import hydra_setup
from dpbench.app.run import run_experiment
from dpbench.core.results import RunResults, read_results
from dpbench.privacy.accountant import PrivacyAccountant
from dpbench.privacy.ledger import DeclaredComposition, PrivacyLedger
from dpbench.privacy.mechanisms import Mechanism, SubsampledGaussian
from dpbench.privatizers import PrivacySettings, make_strategy
from dpbench.privatizers.vanilla import Vanilla

LEDGER_LOG = "dpbench.privacy.ledger"


class ZeroRateSteps(Vanilla):
    """Declares the vanilla composition (what calibration used) but records every step at sampling rate 0."""

    def step_mechanisms(self, step: int) -> list[Mechanism]:
        return [SubsampledGaussian(0.0, self.noise_multiplier)]


class SlightlyNoisierSteps(Vanilla):
    """Records sigma (1 + 1e-7): the same epsilon up to the accountant's own discretisation error."""

    def step_mechanisms(self, step: int) -> list[Mechanism]:
        return [SubsampledGaussian(self.privacy.sampling_rate, self.noise_multiplier * (1 + 1e-7))]


class MuchNoisierSteps(Vanilla):
    def step_mechanisms(self, step: int) -> list[Mechanism]:
        return [SubsampledGaussian(self.privacy.sampling_rate, self.noise_multiplier * 1.5)]


def _dataset(size: int = 400) -> TensorDataset:
    torch.manual_seed(0)
    x = torch.randn(size, 6)
    return TensorDataset(x, (x[:, 0] > 0).long())


def _declared(private: dpbench.PrivateTraining, steps: int) -> float:
    composition = private.strategy.composition(private.noise_multiplier, steps)
    return PrivacyAccountant().epsilon(composition, private.plan.delta).epsilon


def _train(privatizer, steps: int, every: int, ask=None, **budget) -> tuple[dpbench.PrivateTraining, list]:
    """make_private over `steps` steps, asking epsilon() every `every` steps (through `ask(private)` if given)."""
    model = nn.Linear(6, 2)
    loader = dpbench.poisson_loader(_dataset(), batch_size=40)
    private = dpbench.make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), loader, privatizer,
                                   steps=steps, **budget)
    seen = []
    while private.steps < steps:
        for batch in loader:
            private.step(batch)
            if private.steps % every == 0:
                seen.append((private.steps, (ask or dpbench.PrivateTraining.epsilon)(private)))
            if private.steps == steps:
                break
    return private, seen


def test_make_private_never_reports_less_than_the_declared_composition(caplog):
    with caplog.at_level(logging.WARNING, logger=LEDGER_LOG):
        private, seen = _train({"_target_": ZeroRateSteps, "name": "zero_rate"}, 10, 5, noise_multiplier=1.0)
    for steps, spent in seen:  # mid-run and final epsilon() calls
        declared = _declared(private, steps)
        assert declared > 0.1
        assert spent.epsilon == pytest.approx(declared)
        assert spent.ledger_underreported is not None
        assert spent.ledger_underreported.ledger_epsilon == 0.0
        assert spent.ledger_underreported.composition_epsilon == pytest.approx(declared)
        assert spent.ledger_underreported.steps == steps
    assert "under-report" in caplog.text and "ZeroRateSteps" in caplog.text


def test_a_ledger_within_the_accountants_error_is_not_flagged_and_a_noisier_one_is():
    _, seen = _train({"_target_": SlightlyNoisierSteps, "name": "same"}, 6, 6, noise_multiplier=1.0)
    assert seen[-1][1].ledger_underreported is None
    private, seen = _train({"_target_": MuchNoisierSteps, "name": "noisier"}, 6, 6, noise_multiplier=1.0)
    assert seen[-1][1].ledger_underreported is not None
    assert seen[-1][1].epsilon == pytest.approx(_declared(private, 6))


D2P2_EXPONENTIAL = {"name": "d2p2", "noise_decay": "exponential", "decay_rate": 2.0, "dim": 4}


@pytest.mark.parametrize("privatizer", ["vanilla", D2P2_EXPONENTIAL])
def test_builtins_are_not_flagged_and_cost_no_second_accountant_call(privatizer, monkeypatch):
    """D2P2's exponential schedule depends on the run's length: a 4-step prefix of a 12-step run is not a 4-step run,
    so the declared figure for the steps taken is the planned composition's prefix."""
    calls = []
    epsilon = PrivacyAccountant.epsilon

    def counted(self, composition, delta):
        calls.append(composition)
        return epsilon(self, composition, delta)

    def ask(private: dpbench.PrivateTraining) -> tuple[dpbench.PrivacySpent, int]:
        calls.clear()
        return private.epsilon(), len(calls)

    monkeypatch.setattr(PrivacyAccountant, "epsilon", counted)
    _, seen = _train(privatizer, 12, 4, ask, noise_multiplier=1.0)
    assert [steps for steps, _ in seen] == [4, 8, 12]
    for _, (spent, accountant_calls) in seen:
        assert spent.ledger_underreported is None and math.isfinite(spent.epsilon) and spent.epsilon > 0
        assert accountant_calls == 1  # the ledger's own figure only: the declared one is the same composition


def test_own_lightning_trainer_reports_the_declared_composition(caplog):
    torch.manual_seed(0)
    x = torch.randn(500, 6)
    y = (x[:, 0] > 0).long()
    data = dpbench.DataBundle("toy", dpbench.TensorSplit(x[:400], y[:400]), dpbench.TensorSplit(x[400:], y[400:]),
                              num_classes=2)
    module, datamodule = dpbench.make_private_module(
        nn.Linear(6, 2), data, {"_target_": ZeroRateSteps, "name": "zero_rate"},
        optimizer=dpbench.OptimizerConfig(lr=0.1), batch_size=40, steps=6, target_epsilon=3.0,
    )
    trainer = L.Trainer(max_steps=6, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
                        limit_val_batches=0)
    with caplog.at_level(logging.WARNING, logger=LEDGER_LOG):
        trainer.fit(module, datamodule=datamodule)
    assert "under-report" in caplog.text  # said at the end of the fit, before anyone asks
    report = module.epsilon()
    declared = PrivacyAccountant().epsilon(module.strategy.composition(module.plan.noise_multiplier, 6), 1e-5)
    assert module.ledger.steps == 6
    assert report.epsilon == pytest.approx(declared.epsilon) and 0.5 < report.epsilon <= 3.0
    assert module.ledger.underreported is not None and module.ledger.underreported.ledger_epsilon == 0.0


def _run(tmp_path, *overrides: str) -> RunResults:
    cfg = hydra_setup.compose(["max_steps=4", "batch_size=200", "logger.wandb=false",
                               "trainer.enable_progress_bar=false", "trainer.checkpoint=false", "eval_batch_size=1000",
                               *overrides])
    return run_experiment(cfg, tmp_path)


def test_a_run_marks_results_when_the_ledger_under_reports(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger=LEDGER_LOG):
        out = _run(tmp_path / "plugin", "+privatizer._target_=tests.privacy.test_epsilon_crosscheck.ZeroRateSteps")
    assert "under-report" in caplog.text
    for results in (out, read_results(tmp_path / "plugin")):
        assert results.epsilon > 0.1
        mark = results.ledger_underreported
        assert mark["ledger_epsilon"] == 0.0 and mark["steps"] == 4
        assert results.epsilon == pytest.approx(mark["composition_epsilon"]) and results.epsilon > 0.1
    vanilla = _run(tmp_path / "vanilla")
    assert vanilla.ledger_underreported is None and vanilla.epsilon > 0.1


def test_an_extended_d2p2_run_is_checked_against_the_plans_its_steps_were_taken_under():
    """extend_run: the first steps followed the shorter plan's buckets, the rest the longer plan's; composition(sigma,
    T2) alone charges the first steps differently, and its figure lies above the ledger's beyond the error bar."""
    accountant = PrivacyAccountant()
    first, longer = 6, 12

    def strategy_for(planned: int) -> dpbench.PrivatizerStrategy:
        strategy = make_strategy(OmegaConf.create({"name": "d2p2", "buckets": 2, "dim": None}),
                                 PrivacySettings(1.0, 0.1, 4.0))
        strategy.prepare(None, planned, 1e-5, None, accountant)
        return strategy

    def ledger_for(strategy, planned: int) -> PrivacyLedger:
        return PrivacyLedger(1e-5, accountant, DeclaredComposition(strategy.composition, 4.0, planned, "d2p2"))

    short = strategy_for(first)
    ledger = ledger_for(short, first)
    for step in range(first):
        ledger.record(short.step_mechanisms(step))
    extended = strategy_for(longer)
    resumed = ledger_for(extended, longer)
    resumed.load_state_dict(ledger.state_dict())
    for step in range(first, longer):
        resumed.record(extended.step_mechanisms(step))
    report = resumed.epsilon()
    assert resumed.underreported is None and resumed.plans == [(0, first), (first, longer)]
    naive = accountant.epsilon(extended.composition(4.0, longer), 1e-5)
    assert report.epsilon < naive.epsilon_lower  # what a check against composition(sigma, steps) would have flagged


def test_every_epochs_epsilon_is_checked_not_only_the_last(tmp_path, compose):
    """The per-epoch figure (the CSV, W&B and privacy_ledger.json) comes from a coarser accountant: it is
    cross-checked too, so no epoch of the under-reporting plugin logs epsilon 0."""
    cfg = compose(["max_steps=6", "batch_size=2000", "logger.wandb=false", "trainer.enable_progress_bar=false",
                   "trainer.checkpoint=false", "eval_batch_size=1000",
                   "+privatizer._target_=tests.privacy.test_epsilon_crosscheck.ZeroRateSteps"])
    run_experiment(cfg, tmp_path)
    history = json.loads((tmp_path / "privacy_ledger.json").read_text())["epsilon_spent"]
    assert len(history) == 3
    assert all(entry["epsilon"] > 0.1 for entry in history)
