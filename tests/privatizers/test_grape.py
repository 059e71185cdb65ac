"""DP-GRAPE: projected per-sample gradients, clipping in the projected space, projected Adam, projection windows."""

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from dpbench.core.errors import ConfigurationError
from dpbench.core.optim import OptimizerConfig
from dpbench.core.tasks import ClassificationTask
from dpbench.privacy.randomness import PrivacyRandomness
from dpbench.privatizers import PrivacySettings, make_strategy
from dpbench.privatizers.base import StepContext
from dpbench.privatizers.per_sample import HookEngine
from dpbench.privatizers.projections import RandomProjections
from tests.helpers.cli import FAST, dpbench, results
from tests.helpers.transformer_models import TRANSFORMERS

pytestmark = pytest.mark.models_as_built

TASK = ClassificationTask()
ADAM = OptimizerConfig(name="adam", lr=1e-2)


class Mixer(nn.Module):
    """Wide and narrow Linear layers (both projection sides), a LayerNorm and a small unprojected head."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(6, 12)  # 12 x 6: projected on the right
        self.norm = nn.LayerNorm(12)
        self.down = nn.Linear(12, 7)  # 7 x 12: projected on the left
        self.head = nn.Linear(7, 3)  # min side 3 <= rank: exact

    def forward(self, x):
        return self.head(torch.tanh(self.down(self.norm(torch.tanh(self.up(x))))))


def mixer_batch(size: int = 5, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(size, 4, 6, generator=generator).mean(1), torch.randint(0, 3, (size,), generator=generator)


def grape(rank: int = 4, update_every: int = 3, sigma: float = 1.0, clip: float = 1.0, seed: int = 0):
    settings = PrivacySettings(clip, 0.1, sigma, PrivacyRandomness(seed))
    return make_strategy(OmegaConf.create({"name": "grape", "rank": rank, "update_every": update_every}), settings)


CASES = {"mixer": (Mixer, mixer_batch), "vit": TRANSFORMERS["vit"], "gpt2": TRANSFORMERS["gpt2"]}


@pytest.mark.parametrize("case", sorted(CASES))
def test_projected_per_sample_gradients_equal_the_projection_of_exact_ones(case):
    torch.manual_seed(0)
    build, make_batch = CASES[case]
    model, batch = build(), make_batch()
    exact = HookEngine(model).per_sample_gradients(TASK, batch)
    strategy = grape(rank=4)
    strategy.attach(model)
    projected = strategy.engine.per_sample_gradients(TASK, batch)
    specs = strategy.projections.specs
    assert specs and {s.left for s in specs.values()} == {True, False}  # both sides are exercised
    for name, param in model.named_parameters():
        if param in specs:
            matrix = strategy.projections.matrix(param)
            reference = matrix.T @ exact[name] if specs[param].left else exact[name] @ matrix
            assert projected[name].shape[1:] == specs[param].projected_shape
            torch.testing.assert_close(projected[name], reference, atol=1e-5, rtol=1e-4)
        else:
            torch.testing.assert_close(projected[name], exact[name])


def test_each_clipped_contribution_is_bounded_in_the_projected_space():
    torch.manual_seed(0)
    model = Mixer()
    inputs, targets = mixer_batch(6)
    inputs[2] *= 1e4  # an outlier
    clip = 0.1
    strategy = grape(clip=clip)
    strategy.attach(model)
    per_sample = strategy.engine.per_sample_gradients(TASK, (inputs, targets))
    norms = torch.stack([g.flatten(1).pow(2).sum(1) for g in per_sample.values()]).sum(0).sqrt()
    result = strategy.engine.clipped_sum(TASK, (inputs, targets), clip)
    torch.testing.assert_close(result.norms, norms, atol=1e-4, rtol=1e-4)  # the norm is the projected one
    assert norms.max() > 10 * clip
    for i in range(6):
        alone = strategy.engine.clipped_sum(TASK, (inputs[i : i + 1], targets[i : i + 1]), clip)
        assert torch.sqrt(sum(g.pow(2).sum() for g in alone.grads.values())) <= clip * (1 + 1e-5)


@pytest.mark.parametrize("update_every", [10, 2])
def test_projected_adam_is_adam_on_the_projected_gradient_mapped_back(update_every):
    """With a refresh (update_every=2) the moments carry over and each step maps back with its own window's matrix."""
    torch.manual_seed(0)
    model = Mixer()
    strategy = grape(rank=4, update_every=update_every)
    strategy.attach(model)
    optimizer = strategy.configure_optimizer(model, ADAM)
    weight = model.down.weight
    expected = weight.detach().clone()
    shadow = torch.zeros(strategy.projections.specs[weight].projected_shape, requires_grad=True)
    reference = torch.optim.Adam([shadow], lr=ADAM.lr)
    for step in range(4):
        strategy.privatize(model, TASK, mixer_batch(seed=step), StepContext(step, 5.0))
        shadow.grad = strategy._projected_grads[weight].clone()
        before = shadow.detach().clone()
        strategy.apply_update(optimizer)
        reference.step()
        expected += strategy.projections.back(weight, shadow.detach() - before)
        assert optimizer.state[weight]["exp_avg"].shape == shadow.shape  # moments live in the projected space
    torch.testing.assert_close(weight.detach(), expected, atol=1e-6, rtol=1e-5)


def test_projections_hold_within_a_window_of_f_steps_and_change_after_it():
    model = Mixer()
    projections = RandomProjections(model, rank=4, update_every=3, randomness=PrivacyRandomness(7))
    weight = model.up.weight

    def at(step, seed=7):
        other = RandomProjections(model, 4, 3, PrivacyRandomness(seed))
        other.step = step
        return other.matrix(weight)

    rng = torch.get_rng_state()
    torch.testing.assert_close(at(0), at(2))
    assert not torch.allclose(at(2), at(3))
    torch.testing.assert_close(at(3), at(5))
    assert not torch.allclose(at(0, seed=7), at(0, seed=8))
    down = RandomProjections(model, 4, 3, PrivacyRandomness(7)).matrix(model.down.weight)
    assert not torch.allclose(at(0), down[: at(0).shape[0]])
    assert torch.equal(torch.get_rng_state(), rng)  # the global RNG is never used
    assert projections.specs[weight].projected_shape == (12, 4)


def test_projection_entries_have_variance_one_over_r():
    model = nn.Sequential(nn.Linear(400, 300))
    projections = RandomProjections(model, rank=50, update_every=1, randomness=PrivacyRandomness(0))
    matrix = projections.matrix(model[0].weight)
    assert matrix.shape == (300, 50)
    assert abs(float(matrix.var()) * 50 - 1) < 0.05 and abs(float(matrix.mean())) < 0.01


def test_every_trainable_parameter_receives_a_private_update():
    torch.manual_seed(0)
    model = TRANSFORMERS["vit"][0]()
    strategy = grape(rank=4)
    strategy.attach(model)
    optimizer = strategy.configure_optimizer(model, ADAM)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    strategy.privatize(model, TASK, TRANSFORMERS["vit"][1](), StepContext(0, 4.0))
    for name, param in model.named_parameters():
        projected = param in strategy.projections.specs
        grad = strategy._projected_grads.get(param) if projected else param.grad
        assert grad is not None, name
    strategy.apply_update(optimizer)
    assert not strategy._projected_grads  # consumed by the step
    for name, param in model.named_parameters():
        assert not torch.equal(param.detach(), before[name]), name


def test_grape_needs_adam():
    strategy = grape()
    strategy.attach(Mixer())
    with pytest.raises(ConfigurationError, match="optimizer=adam"):
        strategy.configure_optimizer(Mixer(), OptimizerConfig(name="sgd"))


def test_grape_trains_a_vit_from_the_command_line(tmp_path):
    run = dpbench("model=vit", "model.patch_size=4", "model.hidden_size=16", "model.num_layers=1", "data=digits",
                  "privatizer=grape", "privatizer.rank=4", "optimizer=adam", "batch_size=64", "max_steps=3",
                  "privacy.epsilon=8", *FAST, f"hydra.run.dir={tmp_path}")
    assert run.returncode == 0, run.stderr[-3000:]
    out = results(tmp_path)
    assert out["privatizer"] == "grape" and out["private"] and 0 < out["epsilon"] <= 8
    assert out["steps"] == 3 and out["model"] == "vit"


EXPERIMENTS = ["grape_vit_mnist", "grape_memory", "grape_minilm_sentiment", "grape_roberta_sst2", "grape_opt"]


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiments_compose_into_valid_configs(name, compose):
    from dpbench.core.config import Config, validated
    from dpbench.data import DATASETS
    from dpbench.models import MODELS
    from dpbench.privatizers import STRATEGIES

    switch = {"grape_vit_mnist": "dp_galore", "grape_memory": "vanilla", "grape_minilm_sentiment": "vanilla"}
    overrides = [f"+experiment={name}"] + ([f"privatizer={switch[name]}"] if name in switch else [])
    cfg = compose(overrides)
    validated(Config, cfg, "top-level")
    validated(MODELS[cfg.model.name].schema, cfg.model, "model")
    validated(DATASETS[cfg.data.name].schema, cfg.data, "data")
    validated(STRATEGIES[cfg.privatizer.name].schema, cfg.privatizer, "privatizer")
    if "tokenizer" in cfg.data:
        assert cfg.data.tokenizer == cfg.model.tokenizer


def test_dp_galore_projects_the_privatized_gradient_on_its_top_singular_vectors():
    """Naive DP-GaLore: with sigma 0 the privatized gradient is the clipped mean; P R is its best rank-r fit."""
    torch.manual_seed(0)
    model, batch = Mixer(), mixer_batch(8)
    settings = PrivacySettings(1.0, 0.1, 0.0, PrivacyRandomness(0))
    strategy = make_strategy(OmegaConf.create({"name": "dp_galore", "rank": 4, "update_every": 2}), settings)
    strategy.attach(model)
    optimizer = strategy.configure_optimizer(model, ADAM)
    full = HookEngine(model).clipped_sum(TASK, batch, 1.0).grads
    strategy.privatize(model, TASK, batch, StepContext(0, 8.0))
    for weight in strategy.projections.specs:
        name = next(n for n, p in model.named_parameters() if p is weight)
        gradient = full[name] / 8.0
        matrix = strategy.projections.matrix(weight)
        torch.testing.assert_close(matrix.T @ matrix, torch.eye(4), atol=1e-5, rtol=0)
        residual = gradient - strategy.projections.back(weight, strategy._projected_grads[weight])
        singular = torch.linalg.svdvals(gradient)
        torch.testing.assert_close(residual.pow(2).sum(), singular[4:].pow(2).sum(), atol=1e-6, rtol=1e-4)
    strategy.apply_update(optimizer)
    assert all(optimizer.state[w]["exp_avg"].shape == s.projected_shape for w, s in strategy.projections.specs.items())
