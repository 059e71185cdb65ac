"""The examples in examples/ run a few steps each, as a user runs them."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from dpbench.core.tasks import ClassificationTask
from dpbench.privatizers import PrivacySettings, StepContext, make_strategy
from tests.helpers.cli import FAST, ROOT, results
from tests.helpers.per_sample_reference import loop_gradients, loop_norms

EXAMPLES = ROOT / "examples"


def with_examples(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "PYTHONPATH": str(EXAMPLES)}
    return subprocess.run([sys.executable, "-m", "dpbench", "--config-dir", str(EXAMPLES / "conf"), *args, *FAST],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_own_model_through_the_cli(tmp_path):
    out = with_examples("model=mlp", "model.hidden=32", "max_steps=3", f"hydra.run.dir={tmp_path}")
    assert out.returncode == 0, out.stderr
    ran = results(tmp_path)
    assert ran["model"] == "mlp" and ran["config"]["model"]["hidden"] == 32
    assert ran["private"] and ran["steps"] == 3 and 0 < ran["epsilon"] <= 3.0


def test_own_privatizers_in_a_multirun_beside_vanilla(tmp_path):
    """per_layer (vmap by hand) and auto_clip (dpbench's per-sample engine) train beside vanilla."""
    out = with_examples("-m", "privatizer=vanilla,per_layer,auto_clip", "max_steps=3", "profiler.fresh_process=never",
                        f"hydra.sweep.dir={tmp_path}")
    assert out.returncode == 0, out.stderr
    runs = {r["privatizer"]: r for r in map(results, sorted(p.parent for p in tmp_path.glob("*/results.json")))}
    assert set(runs) == {"vanilla", "per_layer", "auto_clip"}
    for own in ("per_layer", "auto_clip"):
        assert runs[own]["accountant_method"] == "prv" and runs[own]["epsilon"] <= 3.0 and runs[own]["steps"] == 3
        # the same composition (one subsampled Gaussian per step), so the built-in accountant calibrates the same sigma
        assert runs[own]["noise_multiplier"] == runs["vanilla"]["noise_multiplier"]
    assert "sweep summary (3 runs)" in out.stdout


def test_per_layer_privatizer_clips_what_the_accountant_assumes(monkeypatch):
    """One sample, next to no noise: its contribution to the step's sum has norm at most C (per layer C/sqrt(L))."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    strategy = make_strategy({"_target_": "my_privatizer.PerLayerClipping"}, PrivacySettings(0.5, 0.1, 1e-9))
    strategy.attach(model)
    batch = (100 * torch.randn(1, 5), torch.tensor([1]))
    strategy.privatize(model, ClassificationTask(), batch, StepContext(0, 1.0))
    norms = torch.stack([p.grad.norm() for p in model.parameters()])
    assert torch.all(norms <= 0.5 / 2 + 1e-6) and norms.max() > 0.5 / 2 * 0.9
    assert norms.norm() <= 0.5 + 1e-6


def test_auto_clip_privatizer_sums_what_automatic_clipping_defines(monkeypatch):
    """Through dpbench's engine, sum_i C / (||g_i|| + gamma) g_i, against one backward pass per sample."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    strategy = make_strategy({"_target_": "auto_clip.AutoClipping", "gamma": 0.1}, PrivacySettings(0.5, 0.1, 1e-9))
    strategy.attach(model)
    batch = (torch.randn(4, 5) * torch.tensor([[0.01], [1.0], [10.0], [100.0]]), torch.tensor([0, 1, 2, 1]))
    reference = loop_gradients(model, batch)
    factors = 0.5 / (loop_norms(reference) + 0.1)
    strategy.privatize(model, ClassificationTask(), batch, StepContext(0, 1.0))
    for name, param in model.named_parameters():
        expected = sum(factor * sample[name] for factor, sample in zip(factors, reference, strict=True))
        torch.testing.assert_close(param.grad, expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("script", ["plain_loop.py", "own_trainer.py"])
def test_library_examples(script):
    main = runpy.run_path(str(Path(EXAMPLES / script)), run_name="example")["main"]
    spent = main(5)
    assert 0 < spent.epsilon <= 3.0
