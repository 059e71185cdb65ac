"""The engine `privatizer.engine=auto` gives each built-in model: the fast hook engine (the README's table), through
the same builder a run uses; a hand-written model of the same layers inside a class of its own gets vmap."""

import pytest
import torch
from torch import nn

import dpbench
from benchmarks.engines import CASES, engine_of, rows
from dpbench.models.provenance import built_by_dpbench
from dpbench.privatizers.per_sample.construction import fast_path_refusal
from tests.helpers.construction_models import FEATURES, WarmupMixup
from tests.helpers.transformer_models import bert, image_batch, opt, text_batch, vit


@pytest.mark.parametrize("name", ["cnn", "vit", "lstm", "minilm", "minilm (LoRA)", "opt", "word2vec"])
def test_each_built_in_model_keeps_the_hook_engine(name):
    assert rows([name]) == {name: "hooks"}


def test_a_plugin_model_of_its_own_class_runs_under_vmap_naming_it():
    overrides, data = CASES["cnn"]
    engine = engine_of({"_target_": "tests.helpers.construction_models.build_user_model", "name": "user"}, data)
    assert engine.startswith("functorch (vmap)") and "Flattened" in engine


def test_a_built_model_whose_module_is_swapped_is_no_longer_proven():
    model = built_by_dpbench(nn.Sequential(nn.Linear(FEATURES, 4), nn.Tanh()))
    assert fast_path_refusal(model) is None
    model[1] = WarmupMixup(4, 4)
    assert "other modules than dpbench built it with" in fast_path_refusal(model)


@pytest.mark.parametrize("layer, reason", [
    (nn.Flatten(0), "batch dimension"), (nn.Softmax(dim=0), "batch dimension"),
    (nn.BatchNorm1d(FEATURES), "forward dpbench has not proven"),
])
def test_torch_layers_that_can_mix_the_batch_are_not_proven(layer, reason):
    assert reason in fast_path_refusal(nn.Sequential(nn.Linear(FEATURES, FEATURES), layer))


@pytest.mark.parametrize("build", [bert, opt, vit])
def test_built_transformers_take_real_steps_with_their_buffers_untouched(build):
    """The per-step guard compares every buffer's version: the checks' own restore of the buffers (BERT's
    position_ids) must not bump them, or every built-in transformer would be refused at its first step."""
    model = built_by_dpbench(build())
    batch = image_batch(8) if build is vit else text_batch(8)
    loader = dpbench.poisson_loader(torch.utils.data.TensorDataset(torch.zeros(64, 1)), 8)
    private = dpbench.make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), loader, steps=3,
                                   noise_multiplier=1.0)
    for _ in range(3):
        private.step(batch)
    assert private.ledger.steps == 3 and private.strategy.checks.engine["name"] == "hooks"
