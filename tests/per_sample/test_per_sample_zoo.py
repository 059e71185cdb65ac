"""Exact per-sample clipping or a clear refusal, never wrong numbers: every layer type with parameters, the patterns
that fool module hooks and tiny Hugging Face models (tests/helpers/zoo_models.py), in float64 against a per-example
loop, through vanilla's privatize and its make_engine('auto') engine; the hook-based strategies on the same patterns."""

import logging
import re

import pytest
import torch
from omegaconf import OmegaConf

from dpbench.core.errors import UnsupportedModelError
from dpbench.core.tasks import ClassificationTask
from dpbench.privatizers import PrivacySettings, make_strategy
from dpbench.privatizers.base import StepContext
from dpbench.privatizers.per_sample import FunctorchEngine, HookEngine, make_engine
from tests.helpers.per_sample_reference import (
    TOLERANCE,
    assert_matches_loop,
    assert_only_the_replaced_norm_moves,
    loop_gradients,
    loop_norms,
)
from tests.helpers.zoo_models import PATTERNS, SAMPLES, ZOO, Entry

pytestmark = [pytest.mark.models_as_built, pytest.mark.usefixtures("one_thread")]  # tiny models: one thread

TASK = ClassificationTask()




ACTION = re.compile(r"\b(use|set|pass|replace|remove|call|freeze|give|make)\b")
"""A refusal says what to do."""


ENGINES = {"hooks": HookEngine, "functorch": FunctorchEngine}


def outcome(entry: Entry, run):
    """run()'s engine, served by the entry's engine (auto falls back to functorch exactly where the hooks would be
    wrong), or None for an entry that must be refused and is, with a message that says what to do."""
    try:
        engine = run()
    except UnsupportedModelError as error:
        assert entry.engine is None, f"refused, but {entry.engine} is exact for it: {error}"
        assert ACTION.search(str(error)), f"the refusal does not say what to do: {error}"
        return None
    assert entry.engine is not None, "a model that must be refused was accepted"
    assert isinstance(engine.engine, ENGINES[entry.engine])
    return engine


def clipped_reference(reference, clip: float) -> dict[str, torch.Tensor]:
    norms = loop_norms(reference)
    factors = (clip / norms).clamp(max=1.0)
    return {name: sum(f * r[name] for f, r in zip(factors, reference, strict=True)) for name in reference[0]}


def setup(name: str):
    torch.manual_seed(0)
    entry = ZOO[name]
    model, batch = entry.build(), entry.batch(0)
    reference = None if entry.engine is None else loop_gradients(model, batch)
    clip = None if reference is None else float(loop_norms(reference).median())  # some samples clipped, some not
    return entry, model, batch, reference, clip


def vanilla(clip: float):
    return make_strategy(OmegaConf.create({"name": "vanilla", "engine": "auto"}), PrivacySettings(clip, 0.5, 0.0))


@pytest.mark.parametrize("name", sorted(ZOO))
def test_exact_per_sample_clipping_or_a_clear_refusal(name):
    """Vanilla's step (noise 0) through its make_engine('auto') engine, which then gives the loop's norms in the
    model's precision and its per-sample gradients, and moves no other sample's norm when one sample is replaced."""
    entry, model, batch, reference, clip = setup(name)
    strategy = vanilla(clip or 1.0)

    def run():
        strategy.attach(model)
        strategy.privatize(model, TASK, batch, StepContext(step=0, expected_batch_size=float(SAMPLES)))
        return strategy.engine

    engine = outcome(entry, run)
    if engine is None:
        return
    expected = clipped_reference(reference, clip)
    for param_name, param in model.named_parameters():
        if param.requires_grad:
            torch.testing.assert_close(param.grad, expected[param_name] / SAMPLES, atol=TOLERANCE, rtol=TOLERANCE)
    norms = engine.clipped_sum(TASK, batch, clip).norms
    assert norms.dtype == torch.float64
    torch.testing.assert_close(norms, loop_norms(reference), atol=TOLERANCE, rtol=TOLERANCE)
    assert_matches_loop(engine.per_sample_gradients(TASK, batch), reference)
    assert_only_the_replaced_norm_moves(lambda b: engine.clipped_sum(TASK, b, 1.0).norms, batch, entry.batch(1))


MISATTRIBUTED = {
    "functional_linear": "fc.weight",
    "tied_embedding_head": "embedding.weight",
    "cat_through_shared_encoder": "body.encoder.weight",
    "time_major_linear_t_equals_b": "body.fc.weight",
    "time_major_lstm_flattened": "step_head.weight",
    "linear_subclass_forward": "body.weight",
    "train_mode_batch_centering": "body.fc.weight",
}
"""Patterns whose hook per-sample gradients would be wrong, and a parameter the refusal must name."""


@pytest.mark.parametrize("name", sorted(MISATTRIBUTED))
def test_explicit_hooks_refuse_what_they_would_get_wrong_naming_the_parameter(name):
    torch.manual_seed(0)
    entry = PATTERNS[name]
    with pytest.raises(UnsupportedModelError, match=re.escape(MISATTRIBUTED[name])):
        HookEngine(entry.build()).clipped_sum(TASK, entry.batch(0), 1.0)


class ReadThenChanged(torch.nn.Module):
    """The input a Linear read is changed in place afterwards: a rule fed the recorded input would see the change."""

    def __init__(self):
        super().__init__()
        self.first, self.second = torch.nn.Linear(6, 6), torch.nn.Linear(6, 3)

    def forward(self, x):
        h = self.first(x)
        out = self.second(h)
        h.mul_(2.0)
        return out


def test_an_input_changed_in_place_after_its_layer_read_it_is_refused():
    model = ReadThenChanged().double()
    batch = (torch.randn(4, 6, dtype=torch.float64), torch.tensor([0, 1, 2, 0]))
    with pytest.raises(UnsupportedModelError, match=r"input of second \(Linear\) was modified in place"):
        HookEngine(model).clipped_sum(TASK, batch, 1.0)


def test_auto_warns_which_parameter_forced_the_fallback(caplog):
    entry = PATTERNS["cat_through_shared_encoder"]
    engine = make_engine(entry.build(), "auto")
    with caplog.at_level(logging.WARNING):
        engine.clipped_sum(TASK, entry.batch(0), 1.0)
    assert "body.encoder.weight" in caplog.text and "functorch" in caplog.text


def test_refusals_name_the_layer_and_what_to_do():
    batchnorm = ZOO["batchnorm_eval_batch_statistics"]
    with pytest.raises(UnsupportedModelError, match="BatchNorm1d.*batch statistics.*GroupNorm"):
        make_engine(batchnorm.build(), "auto")


def grape(rank: int = 2):
    config = OmegaConf.create({"name": "grape", "rank": rank, "update_every": 3})
    return make_strategy(config, PrivacySettings(1.0, 0.1, 1.0))


def assert_grape_projects_exact_per_sample_gradients(name: str) -> set[str]:
    """GRAPE's projected per-sample gradients of a zoo entry against the projected loop; the projected weights."""
    entry, model, batch, reference, _ = setup(name)
    strategy = grape()
    strategy.attach(model)
    projected = strategy.engine.per_sample_gradients(TASK, batch)
    specs = strategy.projections.specs
    assert specs
    assert set(projected) == set(reference[0])  # the trainable parameters only
    for param_name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        exact = torch.stack([r[param_name] for r in reference])
        expected = strategy.projections.project(param, exact) if param in specs else exact
        torch.testing.assert_close(projected[param_name], expected, atol=TOLERANCE, rtol=TOLERANCE)
    return {param_name for param_name, param in model.named_parameters() if param in specs}


@pytest.mark.parametrize("name", ["linear_relu_inplace", "linear_over_tokens_relu_inplace", "keyword_call"])
def test_grape_projects_exact_per_sample_gradients_through_in_place_ops(name):
    assert_grape_projects_exact_per_sample_gradients(name)


def test_grape_projects_exact_per_sample_gradients_of_peft_lora_adapters():
    """peft's lora_A and lora_B (rank 4 > GRAPE's 2) are projected; their frozen base layers get nothing."""
    projected = assert_grape_projects_exact_per_sample_gradients("bert_lora")
    assert {name.rsplit(".", 3)[-3] for name in projected} >= {"lora_A", "lora_B"}


@pytest.mark.parametrize("name", ["cat_through_shared_encoder", "time_major_linear_t_equals_b"])
def test_grape_refuses_per_sample_gradients_it_would_get_wrong(name):
    torch.manual_seed(0)
    entry = PATTERNS[name]
    model = entry.build()
    strategy = grape()
    strategy.attach(model)
    assert strategy.projections.specs
    with pytest.raises(UnsupportedModelError, match=r"body\.\w+\.weight"):
        strategy.privatize(model, TASK, entry.batch(0), StepContext(step=0, expected_batch_size=float(SAMPLES)))


def test_sparse_refuses_per_sample_gradients_it_would_get_wrong():
    torch.manual_seed(0)
    entry = PATTERNS["cat_through_shared_encoder"]
    model = entry.build()
    strategy = make_strategy(OmegaConf.create({"name": "sparse"}), PrivacySettings(1.0, 0.01, 1.0))
    strategy.attach(model)
    with pytest.raises(UnsupportedModelError, match="body.encoder.weight"):
        strategy.accumulate(model, TASK, entry.batch(0), StepContext(step=0, expected_batch_size=float(SAMPLES)))


@pytest.mark.parametrize("privatizer", ["d2p2", "dp_galore"])
def test_other_engine_strategies_fall_back_to_exact_per_sample_gradients(privatizer):
    entry, model, batch, reference, _ = setup("cat_through_shared_encoder")
    config = {"name": privatizer, "engine": "auto"} | ({"rank": 2} if privatizer == "dp_galore" else {})
    strategy = make_strategy(OmegaConf.create(config), PrivacySettings(1.0, 0.1, 1.0))
    strategy.attach(model)
    assert_matches_loop(strategy.engine.per_sample_gradients(TASK, batch), reference)
