"""model.size: the published OPT, RoBERTa and ViT shapes built from config (no weights), composed through Hydra.

Sizes are built on the meta device (shapes only, no memory): an OPT-6.7B in float32 would need 27 GB. Only OPT-125m
is built for real, for one forward pass at batch 2, sequence 8.
"""

import pytest
import torch
from omegaconf import DictConfig

from dpbench.app import hydra_setup
from dpbench.core.errors import ConfigurationError
from dpbench.data.bundle import DataBundle, TensorSplit
from dpbench.models import build_model
from dpbench.models import hf as hf_models
from dpbench.models.published import PUBLISHED
from tests.helpers.cli import dpbench

PUBLISHED_PARAMETERS = {
    # The OPT paper's sizes as the released checkpoints count them (OPTModel; the LM head is tied to the embedding).
    ("opt", "125m"): 125.2e6,
    ("opt", "350m"): 331.2e6,
    ("opt", "1.3b"): 1.316e9,
    ("opt", "2.7b"): 2.652e9,
    ("opt", "6.7b"): 6.658e9,
    # RoBERTa's model cards: 125M and 355M (RobertaModel, its pooler included).
    ("roberta", "base"): 124.6e6,
    ("roberta", "large"): 355e6,
    # Dosovitskiy et al. 2021, Table 1: ViT-Base, 86M.
    ("vit", "base"): 86e6,
}
SIZES = sorted(PUBLISHED_PARAMETERS)


def model_config(*overrides: str) -> DictConfig:
    """The `model` node `python -m dpbench <overrides>` composes (conf/model/*.yaml and the overrides)."""
    return hydra_setup.compose(overrides).model


def text_data(length: int = 8, classes: int = 2) -> DataBundle:
    """MiniLM-tokenized ids (below its 30522 tokens), right padding on one sample."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30522, (4, length), generator=generator)
    mask = torch.ones(4, length, dtype=torch.long)
    mask[1, -3:] = 0
    split = TensorSplit({"input_ids": ids * mask, "attention_mask": mask}, torch.arange(4) % classes)
    return DataBundle("fixture", split, split, classes)


def image_data() -> DataBundle:
    split = TensorSplit(torch.randn(4, 1, 28, 28), torch.arange(4))
    return DataBundle("fixture", split, split, 10, (1, 28, 28))


def data_for(family: str) -> DataBundle:
    return image_data() if family == "vit" else text_data()


def meta_model(family: str, *overrides: str) -> torch.nn.Module:
    """The model `model=family <overrides>` builds, on the meta device: every shape, no memory."""
    config = model_config(f"model={family}", *overrides)
    with torch.device("meta"):
        return build_model(config, data_for(family))


def count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_every_published_size_is_tabled_and_tested():
    assert {(family, size) for family, sizes in PUBLISHED.items() for size in sizes} == set(PUBLISHED_PARAMETERS)


@pytest.mark.parametrize(("family", "size"), SIZES)
def test_parameter_count_is_the_published_one_within_1_percent(family, size):
    """The count a run prints (the whole classifier) and the backbone alone are both within 1% of the published
    figure: the classification head adds hidden x classes (RoBERTa's also a hidden x hidden dense layer, where the
    published count has its pooler, which the classifier does not build)."""
    model = meta_model(family, f"model.size={size}")
    assert all(p.is_meta for p in model.parameters())
    published = PUBLISHED_PARAMETERS[family, size]
    for counted in (count(model), count(model.model.base_model)):
        assert abs(counted / published - 1) < 0.01, f"{family} {size}: {counted:,} against {published:,.0f}"


def test_opt_350m_has_its_own_shape():
    """OPT-350m alone is 1024 wide inside with 512-wide embeddings (project_in / project_out) and post-layer norm."""
    model = meta_model("opt", "model.size=350m").model
    decoder = model.model.decoder
    assert (decoder.project_in.in_features, decoder.project_in.out_features) == (512, 1024)
    assert (decoder.project_out.in_features, decoder.project_out.out_features) == (1024, 512)
    assert tuple(decoder.embed_tokens.weight.shape) == (50272, 512)
    assert model.config.do_layer_norm_before is False and decoder.final_layer_norm is None
    assert len(decoder.layers) == 24 and decoder.layers[0].fc1.out_features == 4096
    assert model.score.in_features == 512  # the head reads the projected-out hidden state
    other = meta_model("opt", "model.size=1.3b").model
    assert other.model.decoder.project_in is None and other.model.decoder.final_layer_norm is not None
    assert other.config.do_layer_norm_before is True and other.config.hidden_size == 2048


def test_dropouts_are_the_published_ones_unless_set():
    opt = meta_model("opt", "model.size=125m").model.config
    assert (opt.dropout, opt.attention_dropout) == (0.1, 0.0)
    roberta = meta_model("roberta", "model.size=base").model.config
    assert (roberta.hidden_dropout_prob, roberta.attention_probs_dropout_prob) == (0.1, 0.1)
    vit = meta_model("vit", "model.size=base").model.config
    assert (vit.hidden_dropout_prob, vit.attention_probs_dropout_prob) == (0.0, 0.0)
    changed = meta_model("opt", "model.size=125m", "model.dropout=0", "model.attention_dropout=0.05").model.config
    assert (changed.dropout, changed.attention_dropout) == (0.0, 0.05)
    small = meta_model("opt").model.config  # the small config: attention dropout follows model.dropout
    assert (small.dropout, small.attention_dropout) == (0.1, 0.1)


def test_a_sized_vocabulary_is_the_published_one_not_the_tokenizers():
    """Sized: the published vocabulary (MiniLM's ids < 30522 fit in it); small: the tokenizer's, as before."""
    assert meta_model("opt", "model.size=2.7b").model.config.vocab_size == 50272
    assert meta_model("roberta", "model.size=large").model.config.vocab_size == 50265
    assert meta_model("roberta").model.config.vocab_size == 30522
    assert meta_model("opt").model.config.vocab_size == 30522


def test_a_tokenizer_larger_than_the_published_vocabulary_is_refused(monkeypatch):
    class Large:
        pad_token_id = 1

        def __len__(self) -> int:
            return 60000

    monkeypatch.setattr(hf_models, "load_tokenizer", lambda name: Large())
    with pytest.raises(ConfigurationError, match="60000 tokens, more than the 50272 of facebook/opt-125m"):
        meta_model("opt", "model.size=125m")


@pytest.mark.parametrize(("family", "size", "known"), [
    ("opt", "13b", "125m, 350m, 1.3b, 2.7b, 6.7b"), ("roberta", "xl", "base, large"), ("vit", "large", "base")])
def test_an_unknown_size_is_refused_naming_the_known_ones(family, size, known):
    with pytest.raises(ConfigurationError, match=f"model={family} knows one of {known}, or null"):
        meta_model(family, f"model.size={size}")


def test_a_size_beside_a_changed_shape_key_or_a_checkpoint_is_refused():
    changed = r"cannot be combined with model\.hidden_size=128, model\.num_layers=4"
    with pytest.raises(ConfigurationError, match=changed):
        meta_model("opt", "model.size=1.3b", "model.num_layers=4", "model.hidden_size=128")
    with pytest.raises(ConfigurationError, match=r"with model\.patch_size=4"):
        meta_model("vit", "model.size=base", "model.patch_size=4")
    with pytest.raises(ConfigurationError, match="set one of them"):
        meta_model("roberta", "model.size=base", "model.pretrained=roberta-base")
    with pytest.raises(ConfigurationError, match="set one of them"):
        meta_model("minilm", "+model.size=base")  # a checkpoint only


def test_opt_125m_composed_by_hydra_runs_a_real_forward():
    torch.manual_seed(0)
    model = build_model(model_config("model=opt", "model.size=125m"), text_data(length=8))
    assert 124e6 < count(model) < 126e6
    batch = text_data(length=8).train.__getitems__([0, 1])[0]
    with torch.no_grad():
        logits = model(batch)
    assert logits.shape == (2, 2) and torch.isfinite(logits).all()


def test_a_run_prints_its_parameter_count(tmp_path):
    run = dpbench("max_steps=1", "batch_size=50", "privacy.noise_multiplier=1", "logger.wandb=false",
                  "trainer.enable_progress_bar=false", "eval_batch_size=1000", f"hydra.run.dir={tmp_path}")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "model=cnn: 26,010 parameters" in run.stdout + run.stderr
