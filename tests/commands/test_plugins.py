"""Plugins: models, data and privatizers from outside dpbench, through `_target_` or entry points, checked before any
training; and make_private's refusal of loaders the accountant does not describe."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpbench
from dpbench.core.config import PrivacyConfig
from dpbench.core.errors import ConfigurationError
from dpbench.core.registry import Registry
from dpbench.data import DATASETS, load_data
from dpbench.models import MODELS, build_model
from dpbench.privatizers import STRATEGIES, PrivacySettings, make_strategy
from dpbench.privatizers.privacy_plan import make_plan
from dpbench.privatizers.vanilla import Vanilla
from tests.helpers.cli import ROOT
from tests.helpers.cli import dpbench as run_cli

EXAMPLES = ROOT / "examples"


class EmptyComposition(Vanilla):
    """Breaks the contract: accounts nothing, so calibration would find any sigma 'private enough'."""

    def composition(self, noise_multiplier: float, steps: int):
        return []


class NoneComposition(Vanilla):
    def composition(self, noise_multiplier: float, steps: int):
        return None


class MissingComposition(Vanilla):
    composition = None


class NotAStrategy:
    config: dpbench.OptimizerConfig

    def __init__(self, config, privacy):
        self.config = config


def _plan(privatizer: dict, steps: int = 10):
    strategy = make_strategy(privatizer, PrivacySettings(1.0, 0.1, None))
    return make_plan(strategy, PrivacyConfig(epsilon=3.0), 0.1, steps, nn.Linear(3, 2))


@pytest.fixture
def examples_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))


def test_builtins_come_in_through_dpbench_entry_points():
    for registry in (STRATEGIES, MODELS, DATASETS):
        declared = {p.name for p in entry_points(group=registry.entry_point_group) if p.dist.name == "dpbench"}
        assert declared and declared == set(registry)
    for preset in (ROOT / "conf" / "privatizer").glob("*.yaml"):
        text = preset.read_text()
        if "\nname:" in text or text.startswith("name:"):
            name = text.split("name:")[1].split()[0]
            assert STRATEGIES[name].factory.name == name


def test_target_model_validated_against_its_declared_dataclass(examples_path):
    data = load_data({"name": "digits"})
    model = build_model({"_target_": "my_mlp.build_mlp", "name": "mlp", "hidden": 7}, data)
    assert model[1].out_features == 7 and model[1].in_features == 64
    with pytest.raises(ConfigurationError, match="hiden"):
        build_model({"_target_": "my_mlp.build_mlp", "name": "mlp", "hiden": 7}, data)
    with pytest.raises(ConfigurationError, match="cannot be imported"):
        build_model({"_target_": "my_mlp.build_mpl", "name": "mlp"}, data)
    with pytest.raises(ConfigurationError, match="declares no config dataclass"):
        build_model({"_target_": "torch.nn.Identity", "name": "x"}, data)


def test_target_data_loader(examples_path):
    def toy(config: dpbench.OptimizerConfig) -> dpbench.DataBundle:  # any dataclass is a schema
        split = dpbench.TensorSplit(torch.randn(10, 3), torch.zeros(10, dtype=torch.long))
        return dpbench.DataBundle(config.name, split, split, num_classes=2)

    assert len(load_data({"_target_": toy, "name": "toy", "validation_size": 2}).train) == 8
    with pytest.raises(ConfigurationError, match="lrr"):
        load_data({"_target_": toy, "name": "toy", "lrr": 1})


@pytest.mark.parametrize("broken, message", [
    (EmptyComposition, "describes no private release"),
    (NoneComposition, "returned None"),
    (MissingComposition, "composition\\(\\) is missing"),
    (NotAStrategy, "not a dpbench.PrivatizerStrategy"),
])
def test_privatizer_breaking_the_contract_is_refused(broken, message):
    with pytest.raises(ConfigurationError, match=message):
        _plan({"_target_": broken, "name": "broken"})


def test_contract_keeps_valid_strategies_and_checks_each_step():
    plan = _plan({"name": "vanilla"})
    assert plan.private and plan.noise_multiplier > 0 and plan.planned_epsilon <= 3.0
    strategy = make_strategy({"name": "vanilla"}, PrivacySettings(1.0, 0.1, 1.0))
    assert len(strategy.step_mechanisms(0)) == 1
    strategy.step_mechanisms.step_mechanisms = lambda step: []
    with pytest.raises(ConfigurationError, match="step_mechanisms"):
        strategy.step_mechanisms(0)


def _fake_distribution(root: Path, name: str, lines: str) -> None:
    info = root / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(lines)


def test_installed_entry_point_is_a_name(tmp_path, monkeypatch, examples_path):
    _fake_distribution(tmp_path, "my-clip", "[dpbench.privatizers]\nmy_clip = my_privatizer:PerLayerClipping\n")
    _fake_distribution(tmp_path, "other-clip", "[dpbench.privatizers]\nvanilla = my_privatizer:PerLayerClipping\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry("privatizer", "dpbench.privatizers")
    assert "my_clip" in registry and registry.component("my_clip").factory.name == "per_layer"
    with pytest.raises(ConfigurationError, match="several entry points"):
        registry.component("vanilla")
    with pytest.raises(ConfigurationError, match="unknown privatizer 'my_clp'"):
        registry.component("my_clp")


def test_entry_point_is_a_config_group_option_on_the_command_line(tmp_path):
    """`privatizer=my_clip` with no yaml anywhere: Hydra finds the option, `privatizer.*` keys are its defaults."""
    _fake_distribution(tmp_path, "my-clip", "[dpbench.privatizers]\nmy_clip = my_privatizer:PerLayerClipping\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(EXAMPLES)]), "WANDB_MODE": "disabled"}
    out = subprocess.run([sys.executable, "-m", "dpbench.plan", "privatizer=my_clip", "max_steps=5",
                          f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert "per_layer (SGD) on mnist5k / cnn: sigma=" in out.stdout and "steps=5" in out.stdout
    assert not (tmp_path / "run").exists()


def test_cli_refuses_a_privatizer_without_composition_before_training(tmp_path):
    run_dir = tmp_path / "run"
    out = run_cli("+privatizer._target_=tests.commands.test_plugins.EmptyComposition", "max_steps=3",
                  f"hydra.run.dir={run_dir}")
    assert out.returncode == 2, out.stderr
    assert "describes no private release" in out.stderr
    assert not (run_dir / "results.json").exists() and not (run_dir / "checkpoints").exists()


def _dataset(size: int = 200) -> TensorDataset:
    x = torch.cat([torch.arange(size, dtype=torch.float32)[:, None], torch.randn(size, 3)], dim=1)
    return TensorDataset(x, torch.randint(0, 2, (size,)))


class IndexModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(x[:, 1:])


def test_make_private_refuses_a_shuffled_loader_unless_the_caveat_is_accepted():
    model = IndexModel()
    loader = DataLoader(_dataset(), batch_size=20, shuffle=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ConfigurationError, match="not Poisson-sampled"):
        dpbench.make_private(model, optimizer, loader, steps=5, target_epsilon=3.0)
    private = dpbench.make_private(model, optimizer, loader, steps=5, target_epsilon=3.0, accept_non_poisson=True)
    for batch in loader:
        private.step(batch)
        if private.steps == 5:
            break
    spent = private.epsilon()
    assert spent.sampling == "shuffle" and "do not strictly satisfy" in spent.caveat
    assert 0 < spent.epsilon <= 3.0 and spent.steps == 5


def test_make_private_draws_fresh_poisson_batches_every_epoch_and_stops_at_its_plan():
    """Step t's batch is keyed by t: the second pass over the loader is not a replay of the first."""
    model = IndexModel()
    loader = dpbench.poisson_loader(_dataset(), batch_size=20)
    private = dpbench.make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), loader, epochs=2,
                                   target_epsilon=3.0)
    epochs = []
    for _ in range(2):
        seen = []
        for batch in loader:
            seen.append(sorted(batch[0][:, 0].long().tolist()))
            private.step(batch)
        epochs.append(seen)
    assert private.steps == 20 and len(epochs[0]) == 10
    assert epochs[0] != epochs[1]
    with pytest.raises(ConfigurationError, match="calibrated"):
        private.step(next(iter(loader)))
    spent = private.epsilon()
    assert 0 < spent.epsilon <= 3.0 and spent.caveat is None and spent.sampling == "poisson"


@pytest.mark.models_as_built
def test_make_private_with_strategies_that_build_their_optimizer_or_add_no_noise():
    def two_steps(privatizer: str | dict, optimizer) -> dpbench.PrivacySpent:
        loader = dpbench.poisson_loader(_dataset(), batch_size=20)
        private = dpbench.make_private(model, optimizer, loader, privatizer, steps=2, target_epsilon=8.0)
        for batch in loader:
            private.step(batch)
            if private.steps == 2:
                break
        return private.epsilon()

    model = IndexModel()
    with pytest.raises(ConfigurationError, match="builds its own optimizer"):
        two_steps({"name": "grape", "rank": 1}, torch.optim.Adam(model.parameters()))
    spent = two_steps({"name": "grape", "rank": 1}, dpbench.OptimizerConfig(name="adam", lr=1e-2))
    assert spent.steps == 2 and 0 < spent.epsilon <= 8.0
    spent = two_steps("nonprivate", torch.optim.SGD(model.parameters(), lr=0.1))
    assert spent.steps == 2 and spent.epsilon == float("inf") and spent.report is None
