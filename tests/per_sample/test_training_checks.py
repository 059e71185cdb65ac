"""The per-sample checks during training, through real runs: what only training shows (a zero-initialised gate that
opens on a misrouted layer, a layer that mixes samples in training mode only) stops a run or switches it to the exact
engine, saying so; the checks stay within their time budget and change nothing the run trains."""

import json
import math

import lightning as L
import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from dpbench.core.errors import UnsupportedModelError
from dpbench.core.optim import OptimizerConfig
from dpbench.core.tasks import ClassificationTask
from dpbench.data import DataBundle, TensorSplit
from dpbench.privacy.accountant import PrivacyAccountant
from dpbench.privacy.ledger import PrivacyLedger
from dpbench.privacy.randomness import PrivacyRandomness
from dpbench.privatizers import PrivacySettings, make_strategy
from dpbench.privatizers.base import StepContext
from dpbench.privatizers.per_sample import PerSampleMismatch
from dpbench.privatizers.per_sample.check_schedule import CheckSchedule
from dpbench.training.datamodule import DPDataModule
from dpbench.training.module import DPModule
from tests.helpers.checked_models import (
    GatedSortedBranch,
    GradientOnlyMixing,
    NoiseLayer,
    ShapeDependentRounding,
    TrainModeCentering,
    TrainModeStandardizing,
)
from tests.helpers.cli import FAST, dpbench

pytestmark = pytest.mark.models_as_built

SIZE, FEATURES, BATCH = 1024, 8, 32


def data() -> DataBundle:
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(SIZE, FEATURES, generator=generator)
    split = TensorSplit(features, (features[:, 0] > 0).long())
    return DataBundle("blobs", split, TensorSplit(features[:64], split.targets[:64]), num_classes=2)


def train(model: nn.Module, privatizer: dict, steps: int, optimizer: str = "sgd", seed: int = 7,
          time_fraction: float | None = None) -> DPModule:
    """`steps` logical steps of a real Trainer over Poisson batches (noise multiplier 1, C = 1), the checks' time
    budget `time_fraction` when given."""
    bundle = data()
    randomness = PrivacyRandomness(seed)
    settings = PrivacySettings(1.0, BATCH / SIZE, 1.0, randomness)
    strategy = make_strategy(OmegaConf.create(privatizer), settings)
    strategy.prepare(model, steps, 1e-5, None, PrivacyAccountant())
    if time_fraction is not None:
        strategy.checks.time_fraction = time_fraction
    module = DPModule(model, bundle.task, strategy, OptimizerConfig(name=optimizer, lr=0.05), PrivacyLedger(1e-5),
                      float(BATCH), train_stats=False)
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=-1, max_steps=steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
        use_distributed_sampler=False,
    )
    trainer.fit(module, datamodule=DPDataModule(bundle, BATCH, "poisson", randomness, eval_batch_size=64))
    return module


HOOKED = {
    "vanilla": ({"name": "vanilla", "engine": "hooks"}, "sgd"),
    "grape": ({"name": "grape", "rank": 4}, "adam"),
    "d2p2": ({"name": "d2p2", "engine": "hooks", "dim": None}, "sgd"),
    "sparse": ({"name": "sparse", "selection": "random"}, "sgd"),
}


@pytest.mark.parametrize("privatizer", sorted(HOOKED))
def test_a_misrouted_layer_behind_a_zero_gate_stops_the_run_when_the_gate_opens(privatizer):
    """The first check passes (the gate is 0, so is the branch's gradient); once the gate opens, a check names the
    branch and the step, and says the steps before were clipped wrongly."""
    config, optimizer = HOOKED[privatizer]
    torch.manual_seed(0)
    with pytest.raises(PerSampleMismatch, match=r"branch\.weight") as stopped:
        train(GatedSortedBranch(FEATURES, 16, 2), config, steps=100, optimizer=optimizer)
    assert stopped.value.step > 0
    assert "not a guarantee" in str(stopped.value)


@pytest.mark.parametrize("privatizer", sorted(HOOKED))
def test_a_sample_alone_rounding_otherwise_than_its_batch_is_not_refused(privatizer):
    """The H100 case: every parameter of OPT-1.3B 0.4% off alone. The checks compare against the sample repeated to
    the batch's shapes, so the run trains through its checks, and the clipped sums are the batch's own gradients."""
    config, optimizer = HOOKED[privatizer]
    torch.manual_seed(0)
    module = train(ShapeDependentRounding(FEATURES, 16, 2), config, steps=12, optimizer=optimizer)
    assert module.ledger.steps == 12 and module.strategy.checks.checked_steps


def test_the_check_at_the_batch_shapes_keeps_exact_sums_and_still_sees_mixing():
    torch.manual_seed(0)
    model = ShapeDependentRounding(6, 6, 3)
    batch = torch.randn(8, 6), torch.randint(0, 3, (8,))
    strategy = make_strategy(OmegaConf.create({"name": "vanilla", "engine": "hooks"}), PrivacySettings(1e6, 0.5, 0.0))
    strategy.attach(model)
    strategy.privatize(model, ClassificationTask(), batch, StepContext(0, 1.0))
    engine = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    ClassificationTask().per_sample_loss(model, batch).sum().backward()  # unclipped: the batch's own gradient
    for name, p in model.named_parameters():
        torch.testing.assert_close(engine[name], p.grad)
    mixing = nn.Sequential(TrainModeCentering(), ShapeDependentRounding(6, 6, 3))
    strategy = make_strategy(OmegaConf.create({"name": "vanilla", "engine": "hooks"}), PrivacySettings(1.0, 0.5, 0.0))
    strategy.attach(mixing)
    with pytest.raises(UnsupportedModelError, match=r"0\.fc\.weight"):
        strategy.privatize(mixing, ClassificationTask(), batch, StepContext(0, 8.0))


def test_auto_switches_to_the_exact_engine_from_the_failing_step_on():
    torch.manual_seed(0)
    module = train(GatedSortedBranch(FEATURES, 16, 2), {"name": "vanilla", "engine": "auto"}, steps=100)
    switched = module.strategy.checks.switched
    assert switched is not None and switched["step"] > 0 and "branch.weight" in switched["parameters"]
    assert type(module.strategy.engine.engine).__name__ == "FunctorchEngine"
    assert module.ledger.steps == 100


def test_train_mode_mixing_is_caught_before_the_first_step_and_auto_bounds_the_add_one_change():
    """A batch norm written by hand (batch mean in training mode only): an eval-mode check passed it and the hooks
    then released a clipped sum whose add-one change exceeded C (4.0 against C = 1 here). Explicit hooks refuse it;
    auto's clipped sums of D and D + x differ by at most C."""
    torch.manual_seed(0)
    model = nn.Sequential(TrainModeCentering(), nn.Tanh(), nn.Linear(6, 3)).double()
    batch = torch.randn(9, 6, dtype=torch.float64), torch.randint(0, 3, (9,))
    batch[0][8] *= 100  # x: a sample with a huge gradient, which the batch mean spreads over every other sample
    hooks = make_strategy(OmegaConf.create({"name": "vanilla", "engine": "hooks"}), PrivacySettings(1.0, 0.5, 0.0))
    hooks.attach(model)
    with pytest.raises(UnsupportedModelError, match=r"0\.fc\.weight"):
        hooks.privatize(model, ClassificationTask(), batch, StepContext(0, 9.0))

    def clipped_sum(inputs, targets) -> torch.Tensor:
        strategy = make_strategy(OmegaConf.create({"name": "vanilla"}), PrivacySettings(1.0, 0.5, 0.0))
        strategy.attach(model)
        strategy.privatize(model, ClassificationTask(), (inputs, targets), StepContext(0, 1.0))
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    without = clipped_sum(batch[0][:8], batch[1][:8])
    with_x = clipped_sum(*batch)
    assert float((with_x - without).norm()) <= 1.0 + 1e-9


def test_batch_statistics_that_a_sample_alone_cannot_form_are_refused_not_skipped():
    """The std of one sample is nan: the per-example pass is not finite where the batch's is, which is a mismatch (a
    check that skipped non-finite references passed this model)."""
    torch.manual_seed(0)
    model = nn.Sequential(TrainModeStandardizing(), nn.Linear(6, 3)).double()
    strategy = make_strategy(OmegaConf.create({"name": "vanilla", "engine": "hooks"}), PrivacySettings(1.0, 0.5, 0.0))
    strategy.attach(model)
    batch = torch.randn(8, 6, dtype=torch.float64), torch.randint(0, 3, (8,))
    with pytest.raises(UnsupportedModelError, match=r"0\.fc\.weight"):
        strategy.privatize(model, ClassificationTask(), batch, StepContext(0, 8.0))


class DropoutNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Dropout(0.5), nn.Linear(16, 2))

    def forward(self, x):
        return self.body(x)


def test_checks_change_nothing_the_run_trains():
    """The same run checked once and checked at every drawn step ends with the same weights, bit for bit (dropout
    masks, buffers and the secret streams untouched), so a resume replays exactly whatever its checks did."""

    def final(time_fraction: float) -> tuple[torch.Tensor, list[int]]:
        torch.manual_seed(3)
        module = train(DropoutNet(), {"name": "vanilla", "engine": "hooks"}, steps=60, time_fraction=time_fraction)
        weights = torch.cat([p.detach().flatten() for p in module.model.parameters()])
        return weights, module.strategy.checks.checked_steps

    once, once_steps = final(0.0)
    often, often_steps = final(math.inf)
    assert once_steps == [0] and len(often_steps) >= 4
    assert torch.equal(once, often)


def test_checked_steps_and_samples_are_secret_draws():
    def schedule(seed: int) -> tuple[list[int], list[list[int]]]:
        checks = CheckSchedule(PrivacyRandomness(seed), time_fraction=math.inf)
        samples = []
        for step in range(400):
            checks.begin_step(step)
            if checks.due():
                samples.append(checks.samples(64))
                checks.checked(0.0, set())
        return checks.checked_steps, samples

    steps, samples = schedule(1)
    assert schedule(1) == (steps, samples)
    assert schedule(2) != (steps, samples)
    assert 4 <= len(steps) <= 2 * math.log2(400)  # geometric: each gap 0.5-1.5 times the steps so far
    assert all(0.5 * (a + 1) - 0.5 <= b - a <= 1.5 * (a + 1) + 0.5 for a, b in zip(steps, steps[1:], strict=False))
    assert all(len(set(s)) == 3 for s in samples)


def _gated_cli(run_dir, engine: str, *overrides: str):
    return dpbench("--config-dir", "tests/conf", "model=gated", f"privatizer.engine={engine}", "batch_size=32",
                   "optimizer.lr=0.05", f"hydra.run.dir={run_dir}", *FAST, *(overrides or ("max_steps=120",)))


def test_cli_stops_a_hooks_run_in_one_line_and_results_claim_no_epsilon(tmp_path):
    out = _gated_cli(tmp_path, "hooks", "max_steps=120", "trainer.checkpoint=false")
    assert out.returncode == 2, out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if "branch.weight" in line]
    assert lines and "not a guarantee" in lines[-1]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["epsilon"] is None and results["steps"] > 0
    assert "not a guarantee" in results["epsilon_caveat"]


def test_cli_auto_switch_is_recorded_and_survives_a_resume(tmp_path):
    """The gate opens within the first steps and its first wake is checked at once; a resumed run continues on the
    engine it switched to and still says that the steps before the switch are not a guarantee."""
    out = _gated_cli(tmp_path, "auto")
    assert out.returncode == 0, out.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    check = results["per_sample_check"]
    switched = check["switched_engine"]
    assert 0 < switched["step"] < 20 and "branch.weight" in switched["parameters"]
    assert "not a guarantee" in results["epsilon_caveat"]
    resumed = _gated_cli(tmp_path, "auto", "max_steps=140", "resume=true", "extend_run=true")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["per_sample_check"]["switched_engine"] == switched
    assert "not a guarantee" in results["epsilon_caveat"] and results["steps"] == 140
    assert "switching to functorch" not in resumed.stderr  # it starts there


def test_checks_after_the_first_stay_within_their_time_budget():
    """Without a wake (no dormant parameter), the drawn checks after the first keep to 2% of the training time: a
    check starts only while the time already spent leaves room for it (the last may overshoot its estimate)."""
    torch.manual_seed(0)
    module = train(DropoutNet(), {"name": "vanilla", "engine": "hooks"}, steps=600)
    checks = module.strategy.checks
    assert len(checks.checked_steps) >= 2
    report = checks.report()
    assert report["check_time_s"] - report["last_check_time_s"] <= checks.time_fraction * checks.training_seconds


class DropPath(nn.Module):
    """Stochastic depth: drops the whole residual branch per sample with torch.bernoulli, not F.dropout."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        keep = torch.bernoulli(torch.full((x.shape[0], 1), 0.7, dtype=x.dtype)) if self.training else 1.0
        return x + keep * self.fc(x)


def test_randomness_besides_dropout_is_refused_by_the_hooks_and_served_by_functorch():
    torch.manual_seed(0)
    model = nn.Sequential(DropPath(), nn.Linear(6, 3)).double()
    batch = torch.randn(8, 6, dtype=torch.float64), torch.randint(0, 3, (8,))
    hooks = make_strategy(OmegaConf.create({"name": "vanilla", "engine": "hooks"}), PrivacySettings(1.0, 0.5, 0.0))
    hooks.attach(model)
    with pytest.raises(UnsupportedModelError, match="random numbers in training mode besides dropout"):
        hooks.privatize(model, ClassificationTask(), batch, StepContext(0, 8.0))
    auto = make_strategy(OmegaConf.create({"name": "vanilla"}), PrivacySettings(1.0, 0.5, 0.0))
    auto.attach(model)
    auto.privatize(model, ClassificationTask(), batch, StepContext(0, 8.0))
    assert type(auto.engine.engine).__name__ == "FunctorchEngine"


def test_train_mode_mixing_through_a_real_trainer():
    """Refused before the first step on explicit hooks; under auto the run trains on functorch."""
    torch.manual_seed(0)

    def centering() -> nn.Module:
        return nn.Sequential(nn.Linear(FEATURES, 6), TrainModeCentering(), nn.Tanh(), nn.Linear(6, 2))

    with pytest.raises(UnsupportedModelError, match=r"1\.fc\.weight"):
        train(centering(), {"name": "vanilla", "engine": "hooks"}, steps=20)
    module = train(centering(), {"name": "vanilla", "engine": "auto"}, steps=20)
    assert type(module.strategy.engine.engine).__name__ == "FunctorchEngine" and module.ledger.steps == 20


def test_jl_refuses_a_forward_that_mixes_samples_while_training():
    """JL clips by one backward of the reweighted losses, exact only when loss_i depends on sample i alone: a
    training-only batch mean broke that silently (add-one change 4.5 against C = 1 in review); now its
    check refuses it before the first step."""
    torch.manual_seed(0)
    batch = torch.randn(9, 6), torch.randint(0, 3, (9,))
    with pytest.raises(UnsupportedModelError, match="mixes samples while training"):  # through a real Trainer
        train(nn.Sequential(nn.Linear(FEATURES, 6), TrainModeCentering(), nn.Tanh(), nn.Linear(6, 2)),
              {"name": "jl", "projections": 8}, steps=10)
    plain = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Dropout(0.3), nn.Linear(6, 3))
    jl = make_strategy(OmegaConf.create({"name": "jl", "projections": 8}), PrivacySettings(1.0, 0.5, 0.0))
    jl.attach(plain)
    jl.privatize(plain, ClassificationTask(), batch, StepContext(0, 9.0))
    assert jl.checks.checked_steps == [0]


def test_jl_refuses_a_layer_that_mixes_the_samples_gradients_only():
    """Every loss is its own sample's, so a loss check passed it, while one sample moved every clipped term (the
    add-one change was 12.4 against C = 1 in review): JL's check compares gradients."""
    torch.manual_seed(0)
    with pytest.raises(UnsupportedModelError, match=r"0\.fc\.weight"):
        train(nn.Sequential(GradientOnlyMixing(FEATURES), nn.Tanh(), nn.Linear(6, 2)),
              {"name": "jl", "projections": 8}, steps=10)


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_jl_refuses_randomness_it_cannot_check(compile):
    """A noise layer besides dropout: a sample alone and in its batch draw different numbers, so nothing can be
    compared, and JL ran unchecked on a model that also centres over the batch. Refused before the first step."""
    torch.manual_seed(0)
    with pytest.raises(UnsupportedModelError, match="random numbers in training mode besides dropout"):
        train(nn.Sequential(NoiseLayer(FEATURES), nn.Tanh(), nn.Linear(6, 2)),
              {"name": "jl", "projections": 8, "compile": compile}, steps=10)
