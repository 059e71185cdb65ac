"""The Tramer & Boneh (ICLR 2021) Fashion-MNIST recipes: the configs hold the paper's hyperparameters, those give the
paper's epsilon 3 under the paper's own accountant, and both recipes run through the CLI on real Fashion-MNIST
(a small subset; skipped without Debian's dataset-fashion-mnist)."""

import math

import pytest
import torch
from omegaconf import OmegaConf
from scipy.special import gammaln, logsumexp

from dpbench import SubsampledGaussian, calibrate, epsilon
from dpbench.app import hydra_setup
from dpbench.data import DataBundle, TensorSplit, load_data
from dpbench.models import build_model
from tests.helpers.cli import FAST, dpbench, results

TRAIN_SIZE = 60_000
# Tramer & Boneh, Table 1 (epsilon 3, delta 1e-5) and its hyperparameter table; the architecture and the [0, 1]
# inputs from their code (github.com/ftramer/Handcrafted-DP: models.py MNIST_CNN and ScatterLinear, data.py).
PAPER = {
    "tramer_boneh_cnn": {
        "model.name": "cnn", "model.activation": "tanh", "model.padding": 2, "batch_size": 2048,
        "optimizer.lr": 4.0, "privacy.noise_multiplier": 2.15,
    },
    "tramer_boneh_scatternet": {
        "model.name": "scatternet_linear", "model.scales": 2, "model.angles": 8, "model.max_order": 2,
        "model.groups": 27, "model.norm_affine": False, "batch_size": 8192, "optimizer.lr": 16.0,
        "privacy.noise_multiplier": 4.05,
    },
}
COMMON = {
    "data.name": "fashion_mnist", "data.standardize": False, "data.train_size": None, "privatizer.name": "vanilla",
    "optimizer.name": "sgd", "optimizer.momentum": 0.9, "optimizer.nesterov": False, "optimizer.weight_decay": 0.0,
    "epochs": 40, "max_steps": None, "privacy.epsilon": 3.0, "privacy.delta": 1e-5, "privacy.clip_norm": 0.1,
    "privacy.sampling": "poisson",
}


def composed(experiment: str):
    return hydra_setup.compose([f"+experiment={experiment}"])


def value(cfg, dotted: str):
    node = cfg
    for key in dotted.split("."):
        node = node[key]
    return node


@pytest.mark.parametrize("experiment", sorted(PAPER))
def test_the_config_holds_the_papers_hyperparameters(experiment):
    cfg = composed(experiment)
    for key, expected in {**COMMON, **PAPER[experiment]}.items():
        assert value(cfg, key) == expected, key


def test_the_cnn_is_the_papers_architecture():
    """Handcrafted-DP's MNIST_CNN: conv 16x8x8 stride 2 padding 2, conv 32x4x4 stride 2, tanh, 26,010 parameters."""
    images = TensorSplit(torch.zeros(2, 1, 28, 28), torch.zeros(2, dtype=torch.long))
    data = DataBundle("fashion_mnist", images, images, 10, (1, 28, 28))
    model = build_model(composed("tramer_boneh_cnn").model, data)
    convolutions = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.stride, c.padding) for c in convolutions] == [
        (16, (8, 8), (2, 2), (2, 2)), (32, (4, 4), (2, 2), (0, 0))]
    assert sum(isinstance(m, torch.nn.Tanh) for m in model.modules()) == 3
    assert sum(p.numel() for p in model.parameters()) == 26_010


def classic_rdp_epsilon(q: float, sigma: float, steps: int, delta: float) -> float:
    """The paper's accountant: Mironov et al.'s RDP of the subsampled Gaussian at integer orders, converted with
    eps = RDP + log(1/delta) / (alpha - 1) (TF-Privacy's and Opacus 0.x's conversion)."""

    def rdp(alpha: int) -> float:
        terms = [gammaln(alpha + 1) - gammaln(k + 1) - gammaln(alpha - k + 1) + (alpha - k) * math.log1p(-q)
                 + k * math.log(q) + (k * k - k) / (2 * sigma**2) for k in range(alpha + 1)]
        return float(logsumexp(terms)) / (alpha - 1)

    return min(steps * rdp(alpha) + math.log(1 / delta) / (alpha - 1) for alpha in range(2, 64))


@pytest.mark.parametrize("experiment", sorted(PAPER))
def test_the_papers_noise_is_epsilon_3_under_its_accountant_and_less_under_dpbenchs(experiment):
    """An epoch is round(N / batch) steps in dpbench as in the paper's code (29 at 2048, 7 at 8192), so the paper's
    noise multiplier gives its epsilon 3 under its own (classic RDP) accounting; dpbench's PRV accountant certifies
    less (2.39 / 2.38) for the same noise, and calibrating to epsilon 3 would take less noise than the paper's."""
    cfg = composed(experiment)
    q, sigma = cfg.batch_size / TRAIN_SIZE, cfg.privacy.noise_multiplier
    steps = cfg.epochs * round(TRAIN_SIZE / cfg.batch_size)
    assert classic_rdp_epsilon(q, sigma, steps, cfg.privacy.delta) == pytest.approx(3.0, abs=0.02)
    spent = epsilon([(SubsampledGaussian(q, sigma), steps)], cfg.privacy.delta).epsilon
    assert spent == pytest.approx(2.385, abs=0.02)
    calibrated = calibrate(lambda s: [(SubsampledGaussian(q, s), steps)], cfg.privacy.epsilon, cfg.privacy.delta)
    assert calibrated < 0.87 * sigma


def test_the_recipes_pixels_lie_in_0_1_as_the_papers(small_fashion_mnist):
    options = {"name": "fashion_mnist", "fashion_mnist_dir": str(small_fashion_mnist)}
    unit = load_data(OmegaConf.create({**options, "standardize": False})).train.features
    assert unit.min() == 0.0 and unit.max() == 1.0 and 0.2 < unit.mean() < 0.4
    standardized = load_data(OmegaConf.create(options)).train.features
    torch.testing.assert_close(standardized, (unit - 0.2860) / 0.3530)


@pytest.mark.parametrize("experiment", sorted(PAPER))
def test_the_recipe_runs_through_the_cli(tmp_path, small_fashion_mnist, experiment):
    cache = tmp_path / "cache"
    scatternet = [f"model.cache_dir={cache}", "trainer.num_threads=1"] if "scatternet" in experiment else []
    run = dpbench(f"+experiment={experiment}", f"data.fashion_mnist_dir={small_fashion_mnist}", "batch_size=128",
                  "max_steps=2", *scatternet, f"hydra.run.dir={tmp_path / 'run'}", *FAST)
    assert run.returncode == 0, run.stderr[-2000:]
    written = results(tmp_path / "run")
    assert (written["model"], written["data"]) == (PAPER[experiment]["model.name"], "fashion_mnist")
    assert (written["train_size"], written["test_size"], written["steps"]) == (512, 256, 2)
    assert written["noise_multiplier"] == PAPER[experiment]["privacy.noise_multiplier"]
    assert written["clip_norm"] == 0.1 and written["noise_multiplier_source"] != "calibrated"
    if "scatternet" in experiment:
        assert len(list(cache.glob("*.pt"))) == 2  # the training and the test split's features


@pytest.mark.parametrize("experiment", sorted(PAPER))
def test_without_the_data_the_recipe_is_a_one_line_refusal(tmp_path, experiment):
    run = dpbench(f"+experiment={experiment}", f"data.fashion_mnist_dir={tmp_path / 'none'}",
                  f"hydra.run.dir={tmp_path / 'run'}", *FAST)
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0 and "apt-get install dataset-fashion-mnist" in run.stderr
