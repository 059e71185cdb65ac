"""The shipped sweeps are the `sweep` config group of dpbench's own conf/ (dpbench/conf in the wheel): `+sweep=NAME`
works from any directory, not only from a checkout's top level as `--config-dir sweeps` did."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from dpbench.app.hydra_setup import config_dir, setup
from dpbench.core.config import Config, validated
from dpbench.plan import BASIC_SWEEPER
from tests.helpers.cli import ROOT

SWEEPS = sorted(p.stem for p in (ROOT / "conf" / "sweep").glob("*.yaml"))


def test_a_shipped_sweep_is_planned_from_another_directory(tmp_path):
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", "dpbench.plan", "-m", "+sweep=compare_privatizers",
                          "privacy.epsilon=3", "max_steps=2"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 2, out.stdout  # the sweep's privatizer grid; the command line's epsilon beats its own 1,3,8
    assert lines[0].startswith("[0] privatizer=nonprivate privacy.epsilon=3") and "not private" in lines[0]
    assert lines[1].startswith("[1] privatizer=vanilla privacy.epsilon=3") and "epsilon=2.999" in lines[1]
    assert list(tmp_path.iterdir()) == []


def sweeper_of(name: str):
    """The `hydra.sweeper` node `+sweep=NAME` composes: the one config here composed with its hydra node
    (return_hydra_config, which dpbench.app.hydra_setup.compose does not offer), so by hand on the same setup."""
    setup()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return hydra_compose("config", overrides=[f"+sweep={name}"], return_hydra_config=True).hydra.sweeper


@pytest.mark.parametrize("name", SWEEPS)
def test_every_shipped_sweep_composes_each_job(name, compose):
    """Every job of a grid composes into a valid config; a search sweeper's keys are keys of the config."""
    sweeper = sweeper_of(name)
    params = [f"{key}={value}" for key, value in OmegaConf.to_container(sweeper.params).items()]
    assert params, f"sweep {name} sweeps nothing"
    if sweeper._target_ != BASIC_SWEEPER:  # Optuna: its points are drawn while it runs
        cfg = validated(Config, compose([f"+sweep={name}"]), "top-level")
        assert all(OmegaConf.select(OmegaConf.structured(cfg), p.partition("=")[0]) is not None for p in params)
        return
    grid = [[]]
    for parsed in OverridesParser.create().parse_overrides(params):
        values = [f"{parsed.get_key_element()}={value}" for value in parsed.sweep_string_iterator()]
        grid = [job + [value] for job in grid for value in values]
    assert len(grid) > 1
    for job in grid:
        validated(Config, compose([f"+sweep={name}", *job]), "top-level")


def test_the_checkout_spelling_names_the_same_sweeps():
    """`--config-dir sweeps --config-name NAME` still works in a checkout: sweeps/NAME.yaml selects sweep NAME."""
    for name in SWEEPS:
        wrapper = OmegaConf.load(ROOT / "sweeps" / f"{name}.yaml")
        assert OmegaConf.to_container(wrapper.defaults) == ["config", {"sweep": name}, "_self_"]
    assert sorted(p.stem for p in (ROOT / "sweeps").glob("*.yaml")) == SWEEPS
