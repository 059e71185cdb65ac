"""Inputs a run cannot be honest with are refused up front: exit 2, one line naming the key, nothing written."""

import json
import os
import subprocess
import sys

import pytest
import torch

from dpbench.core.config import Config, check_run_settings, validated
from dpbench.core.errors import ConfigurationError
from tests.helpers.cli import FAST, ROOT, dpbench

REFUSED = [
    ("physical_batch_size=-1", "physical_batch_size must be a positive micro-batch size"),
    ("optimizer.lr=nan", "optimizer.lr must be a positive finite learning rate"),
    ("eval_batch_size=0", "eval_batch_size must be a positive number"),
    ("resume=maybe", "resume must be false, true or auto"),
]
REFUSED_BY_THE_SCHEMA_CHECK = [  # the same check as above, without a process each
    ("physical_batch_size=0", "physical_batch_size must be a positive micro-batch size"),
    ("optimizer.lr=0", "optimizer.lr must be a positive finite learning rate"),
    ("optimizer.lr=inf", "optimizer.lr must be a positive finite learning rate"),
    ("max_steps=0", "max_steps must be a positive number of steps"),
    ("max_steps=null epochs=0", "epochs must be a positive number of epochs"),
    ("trainer.checkpoint_every_n_steps=0", "trainer.checkpoint_every_n_steps must be a positive"),
    ("trainer.checkpoint_every_minutes=-1", "trainer.checkpoint_every_minutes must be a positive"),
]


def _assert_refused(run, message: str) -> None:
    assert run.returncode == 2, run.stderr[-2000:]
    errors = [line for line in run.stderr.splitlines() if line.startswith("dpbench: error:")]
    assert len(errors) == 1 and message in errors[0], run.stderr[-2000:]
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize("override,message", REFUSED)
def test_bad_setting_is_refused_in_one_line(tmp_path, override, message):
    run = dpbench(*FAST, "max_steps=2" if "max_steps" not in override else "epochs=1",
                  f"hydra.run.dir={tmp_path}", override)  # last: it wins over FAST's eval_batch_size
    _assert_refused(run, message)
    assert not (tmp_path / "results.json").exists() and not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize("overrides,message", REFUSED_BY_THE_SCHEMA_CHECK)
def test_bad_setting_is_refused_by_the_run_settings_check(overrides, message, compose):
    cfg = compose(overrides.split())
    with pytest.raises(ConfigurationError, match=message):
        check_run_settings(validated(Config, cfg, "top-level"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_gpu_accelerator_without_a_gpu_is_refused(tmp_path):
    _assert_refused(dpbench("trainer.accelerator=gpu", "max_steps=2", f"hydra.run.dir={tmp_path}", *FAST),
                    "trainer.accelerator=gpu but this machine has no CUDA GPU")


def test_unwritable_run_directory_is_refused(tmp_path):
    (tmp_path / "a_file").write_text("not a directory")
    _assert_refused(dpbench("max_steps=2", f"hydra.run.dir={tmp_path / 'a_file' / 'run'}", *FAST),
                    "cannot write the run directory")


def test_a_refused_job_does_not_end_its_sweep(tmp_path):
    run = dpbench("-m", "privatizer=jl_r1,vanilla", "privacy.epsilon=null", "privacy.noise_multiplier=1",
                  "max_steps=2", f"hydra.sweep.dir={tmp_path}", *FAST)
    assert run.returncode == 2, run.stderr[-3000:]  # the sweep went on, and still says it is incomplete
    refused = json.loads(next(tmp_path.rglob("refused.json")).read_text())
    assert "privatizer=jl_r1" in refused["overrides"] and "privatizer.projections" in refused["error"]
    ran = json.loads(next(tmp_path.rglob("results.json")).read_text())
    assert ran["privatizer"] == "vanilla" and ran["steps"] == 2
    assert "1 job(s) of this sweep were refused" in run.stdout


HYDRA_REFUSED = [  # caught by Hydra or OmegaConf before dpbench sees the config
    ("privacy.epsilom=3", "privacy.epsilom: no such key (did you mean privacy.epsilon"),
    ("epoch=3", "epoch: no such key (did you mean epochs?)"),
    ("privacy.epsilon=three", "privacy.epsilon: Value 'three' of type 'str' could not be converted to Float"),
    ("epochs=0.5", "epochs: Value '0.5' of type 'float' could not be converted to Integer"),
    ("optimizer=adamw", "optimizer=adamw: no such optimizer (did you mean optimizer=adam?); choose from adam, sgd"),
    ("privatizer=vanila", "privatizer=vanila: no such privatizer (did you mean privatizer=vanilla?)"),
    ("privatizer=dpsgd", "privatizer=dpsgd: no such privatizer; DP-SGD is privatizer=vanilla optimizer=sgd"),
    ("privatizer.engin=hooks", "privatizer.engin: privatizer=vanilla has no key 'engin' (did you mean "
                               "privatizer.engine?)"),
    ("privatizer.rank=4", "privatizer.rank: privatizer=vanilla has no key 'rank'; "),
    ("+privatizer.engin=hooks", "privatizer.engin is not a key of VanillaConfig (did you mean privatizer.engine?)"),
    ("+experiment=dpsgd", "+experiment=dpsgd: no such experiment (did you mean +experiment=dpsgd_mnist5k?)"),
]


@pytest.mark.parametrize("override,message", HYDRA_REFUSED)
def test_hydra_and_omegaconf_errors_are_one_line_with_exit_2(tmp_path, override, message):
    run = dpbench(override, "max_steps=2", f"hydra.run.dir={tmp_path}", *FAST)
    _assert_refused(run, message)
    assert "HYDRA_FULL_ERROR" not in run.stderr and "To append to your config use +" not in run.stderr
    if override == "privatizer.rank=4":  # a key of another component: the ones that take it are named
        assert "privatizer=grape" in run.stderr and "privatizer=dp_galore" in run.stderr


@pytest.mark.parametrize("override,message", [
    ("+privatizer.engin=hooks", "privatizer.engin is not a key of VanillaConfig (did you mean privatizer.engine?)"),
    ("+model.activatoin=relu", "model.activatoin is not a key of CNNConfig (did you mean model.activation?)"),
])
def test_a_component_key_typo_is_refused_before_the_data_loads(tmp_path, override, message):
    """The privatizer and model nodes are checked before the data: here the data is missing, and the typo is named."""
    run = dpbench(override, "data=fashion_mnist", f"data.fashion_mnist_dir={tmp_path / 'none'}", "max_steps=2",
                  f"hydra.run.dir={tmp_path}", *FAST)
    _assert_refused(run, message)


def _tool(module: str, *args: str, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd or ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("command,message", [
    (("dpbench.plan", "--config-dir", "MISSING"), "dpbench.plan: error: --config-dir"),
    (("dpbench.plan", "privacy.epsilom=3"), "dpbench.plan: error: privacy.epsilom: no such key (did you mean"),
    (("dpbench.report", "MISSING"), "dpbench.report: error: no such run or sweep directory"),
    (("dpbench.report", "EMPTY"), "dpbench.report: error: no results.json under"),
])
def test_plan_and_report_refuse_in_one_line(tmp_path, command, message):
    (tmp_path / "EMPTY").mkdir()
    run = _tool(*command, cwd=tmp_path)
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr.strip().splitlines() == [run.stderr.strip()] and message in run.stderr, run.stderr[-2000:]
