"""privatizer.compile: JL's compiled tangent pass gives the eager pass's projections on padded batches, and refuses
the models whose tangents it could not reproduce."""

import pytest
import torch
from omegaconf import OmegaConf

from dpbench.core.errors import ConfigurationError, UnsupportedModelError
from dpbench.core.tasks import ClassificationTask
from dpbench.privacy.randomness import PrivacyRandomness
from dpbench.privatizers import PrivacySettings, make_strategy
from dpbench.privatizers.per_sample.forward_mode.compiled import PADDED_SIZES, pad_batch, padded_size
from tests.helpers.cli import FAST, dpbench, results
from tests.helpers.models import CASES, DropoutMLP, sequence_batch, small_lstm
from tests.helpers.transformer_models import image_batch, vit

pytestmark = pytest.mark.models_as_built

TASK = ClassificationTask()


def jl(compile: bool, seed: int = 3):
    settings = PrivacySettings(1.0, 0.1, 1.0, PrivacyRandomness(seed))
    return make_strategy(OmegaConf.create({"name": "jl", "projections": 4, "compile": compile}), settings)


def as_float64(batch):
    inputs, targets = batch
    return inputs.double(), targets


@pytest.mark.parametrize("build, make_batch", [(vit, image_batch), CASES["cnn"]], ids=["vit", "cnn"])
def test_compiled_projections_are_the_eager_ones(build, make_batch):
    """Same seed, so the same directions: in float64 the two passes agree to rounding, on a batch the compiled pass
    pads (its size is no multiple of PADDED_SIZES)."""
    torch.manual_seed(0)
    model, batch = build().double(), as_float64(make_batch())
    assert batch[1].shape[0] % PADDED_SIZES
    projected = {}
    for compile in (False, True):
        strategy = jl(compile)
        strategy.attach(model)
        losses, projected[compile] = strategy.projections(model, TASK, batch)
        assert losses.shape == (batch[1].shape[0],)
    assert projected[True].shape == projected[False].shape == (batch[1].shape[0], 4)
    scale = projected[False].abs().max()
    assert scale > 0
    assert (projected[True] - projected[False]).abs().max() <= 1e-10 * scale


def test_batches_are_padded_with_their_first_sample_to_a_multiple_of_the_padded_sizes():
    assert [padded_size(n) for n in (1, PADDED_SIZES, PADDED_SIZES + 1)] == [PADDED_SIZES, PADDED_SIZES,
                                                                             2 * PADDED_SIZES]
    inputs, targets = {"ids": torch.arange(6).view(3, 2)}, torch.tensor([7, 8, 9])
    padded_inputs, padded_targets = pad_batch((inputs, targets), PADDED_SIZES)
    assert padded_inputs["ids"].shape == (PADDED_SIZES, 2) and padded_targets.shape == (PADDED_SIZES,)
    assert torch.equal(padded_inputs["ids"][:3], inputs["ids"]) and torch.equal(padded_targets[:3], targets)
    assert torch.all(padded_inputs["ids"][3:] == inputs["ids"][0]) and torch.all(padded_targets[3:] == 7)


def test_a_model_that_draws_random_numbers_is_refused():
    """Compiled code draws its own dropout masks, not the ones of the pass whose gradient is clipped."""
    model = DropoutMLP().train()
    strategy = jl(compile=True)
    strategy.attach(model)
    with pytest.raises(UnsupportedModelError, match="privatizer.compile=true: the model draws random numbers"):
        strategy.projections(model, TASK, sequence_batch())


def test_a_recurrent_model_is_refused_when_attached():
    with pytest.raises(ConfigurationError, match="privatizer.compile=true covers models without recurrent layers"):
        jl(compile=True).attach(small_lstm())


VIT = ["model=vit", "model.patch_size=4", "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2",
       "model.intermediate_size=24", "data=digits", "privatizer=jl", "privatizer.compile=true", "batch_size=32",
       "privacy.epsilon=8", "trainer.checkpoint=false", *FAST]


def test_cli_refuses_the_compiled_pass_for_a_model_with_dropout(tmp_path):
    """Through the run: the refusal comes at the first step, before anything is compiled or trained."""
    run = dpbench(*VIT, "model.hidden_dropout=0.1", "max_steps=3", f"hydra.run.dir={tmp_path}")
    assert run.returncode != 0
    assert "the model draws random numbers" in run.stderr and "privatizer.compile=false" in run.stderr
    assert not (tmp_path / "results.json").exists() or not results(tmp_path).get("steps")


@pytest.mark.slow
def test_cli_trains_a_vit_with_the_compiled_pass(tmp_path):
    """20-50 s, most of it compiling (once: every Poisson batch of about 32 is padded to 64)."""
    run = dpbench(*VIT, "max_steps=3", f"hydra.run.dir={tmp_path}")
    assert run.returncode == 0, run.stderr[-3000:]
    out = results(tmp_path)
    assert out["privatizer"] == "jl" and out["config"]["privatizer"]["compile"] is True
    assert out["steps"] == 3 and 0 < out["epsilon"] <= 8
    assert "compiling JL's tangent pass for batches of 64 samples" in run.stderr + run.stdout
