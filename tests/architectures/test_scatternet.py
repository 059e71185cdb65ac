"""model=scatternet_linear: the per-sample engines serve it exactly (float64, against a per-example loop), and its
scattering features are computed once, cached, and recomputed when the data or a setting changes."""

import logging

import pytest
import torch
from omegaconf import OmegaConf

from dpbench.core.errors import ConfigurationError
from dpbench.core.tasks import ClassificationTask
from dpbench.data import load_data
from dpbench.models import build_model
from dpbench.models import scattering as scattering_module
from dpbench.models.scattering import ScatteringSettings, scattering_features
from dpbench.models.scatternet import ScatterNetLinear
from dpbench.privatizers import PrivacySettings, make_strategy
from dpbench.privatizers.base import StepContext
from dpbench.privatizers.per_sample import HookEngine
from tests.helpers.per_sample_reference import (
    TOLERANCE,
    assert_matches_loop,
    assert_only_the_replaced_norm_moves,
    loop_gradients,
    loop_norms,
)

TASK = ClassificationTask()
SAMPLES = 6


pytestmark = pytest.mark.usefixtures("one_thread")  # kymatio's small FFTs: about 3x slower on two busy threads


def _digits_model(cache_dir, **model):
    data = load_data(OmegaConf.create({"name": "digits"}))
    config = OmegaConf.create({"name": "scatternet_linear", "groups": 27, "cache_dir": str(cache_dir), **model})
    return build_model(config, data), data


def _batch(data, seed: int):
    index = torch.randperm(len(data.train), generator=torch.Generator().manual_seed(seed))[:SAMPLES]
    features, targets = data.train.__getitems__(index.tolist())
    return features.double(), targets


@pytest.mark.parametrize("norm_affine", [False, True])
def test_per_sample_gradients_match_a_per_example_loop(tmp_path, norm_affine):
    """The paper's model (GroupNorm without parameters) and the variant whose GroupNorm trains a scale and shift,
    on real scattering features of digits: the hooks, the engine `auto` picks, give each sample's own gradient, and
    vanilla's step sums the clipped ones."""
    torch.manual_seed(0)
    model, data = _digits_model(tmp_path, norm_affine=norm_affine)
    model = model.double()
    batch = _batch(data, 0)
    reference = loop_gradients(model, batch)
    assert set(reference[0]) == ({"fc.weight", "fc.bias"} | ({"norm.weight", "norm.bias"} if norm_affine else set()))
    hooks = HookEngine(model)
    assert_matches_loop(hooks.per_sample_gradients(TASK, batch), reference)
    torch.testing.assert_close(hooks.clipped_sum(TASK, batch, 1.0).norms, loop_norms(reference), atol=TOLERANCE,
                               rtol=TOLERANCE)
    assert_only_the_replaced_norm_moves(lambda b: hooks.clipped_sum(TASK, b, 1.0).norms, batch, _batch(data, 1))

    clip = float(loop_norms(reference).median())
    strategy = make_strategy(OmegaConf.create({"name": "vanilla", "engine": "auto"}), PrivacySettings(clip, 0.5, 0.0))
    strategy.attach(model)
    strategy.privatize(model, TASK, batch, StepContext(step=0, expected_batch_size=float(SAMPLES)))
    assert isinstance(strategy.engine.engine, HookEngine)
    factors = (clip / loop_norms(reference)).clamp(max=1.0)
    for name, param in model.named_parameters():
        expected = sum(f * r[name] for f, r in zip(factors, reference, strict=True)) / SAMPLES
        torch.testing.assert_close(param.grad, expected, atol=TOLERANCE, rtol=TOLERANCE)


def test_the_model_is_the_papers_groupnorm_and_linear_over_81_channels(tmp_path):
    model, data = _digits_model(tmp_path)
    assert data.input_shape == (81, 2, 2) and data.train.features.shape[1:] == (81, 2, 2)
    assert data.input_transform == "scattering (J=2, L=8, order 2)"
    assert isinstance(model.norm, torch.nn.GroupNorm) and model.norm.num_groups == 27 and not model.norm.affine
    assert sum(p.numel() for p in model.parameters()) == 81 * 2 * 2 * 10 + 10
    assert ScatterNetLinear((81, 7, 7), 10, 27, False).fc.weight.numel() == 39_690  # Fashion-MNIST: 39,700 in all


def test_features_are_kymatios_scattering_of_the_images(tmp_path):
    raw = load_data(OmegaConf.create({"name": "digits"})).test.features
    _, data = _digits_model(tmp_path)
    from kymatio.scattering2d.frontend.torch_frontend import ScatteringTorch2D

    expected = ScatteringTorch2D(J=2, shape=(8, 8), L=8)(raw).reshape(len(raw), 81, 2, 2)
    torch.testing.assert_close(data.test.features, expected)


@pytest.fixture
def counted(monkeypatch):
    """How many images the scattering transform was computed for."""
    seen: list[int] = []

    def counting(images, settings):
        seen.append(len(images))
        return scattering_features(images, settings)

    monkeypatch.setattr(scattering_module, "scattering_features", counting)
    return seen


def test_features_are_computed_once_then_read_from_the_cache(tmp_path, counted, caplog):
    with caplog.at_level(logging.INFO):
        _, first = _digits_model(tmp_path)
    assert counted == [1437, 360] and len(list(tmp_path.glob("*.pt"))) == 2
    assert "computed" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO):
        _, second = _digits_model(tmp_path)
    assert counted == [1437, 360], "the second build recomputed instead of reading the cache"
    assert "read from" in caplog.text
    torch.testing.assert_close(second.train.features, first.train.features)


@pytest.mark.parametrize(("model", "data"), [({"angles": 4}, {}), ({"max_order": 1}, {}), ({}, {"standardize": False}),
                                             ({}, {"train_size": 500})])
def test_a_changed_setting_or_changed_data_recomputes(tmp_path, counted, model, data):
    _digits_model(tmp_path)
    counted.clear()
    loaded = load_data(OmegaConf.create({"name": "digits", **data}))
    groups = {"groups": 0} if model else {}
    build_model(OmegaConf.create({"name": "scatternet_linear", "cache_dir": str(tmp_path), **model, **groups}), loaded)
    assert counted and (len(counted) == 2 if model or "standardize" in data else counted == [500])
    assert len(list(tmp_path.glob("*.pt"))) == 2 + len(counted)  # its own files: the first ones stay valid
    settings = ScatteringSettings(2, model.get("angles", 8), model.get("max_order", 2))
    assert loaded.train.features.shape[1:] == settings.output_shape((1, 8, 8))


def test_a_torn_cache_file_is_recomputed(tmp_path, counted):
    _digits_model(tmp_path)
    for path in tmp_path.glob("*.pt"):
        path.write_bytes(b"torn")
    counted.clear()
    _digits_model(tmp_path)
    assert counted == [1437, 360]


def test_cache_files_are_private_to_the_user(tmp_path):
    _digits_model(tmp_path / "cache")
    assert (tmp_path / "cache").stat().st_mode & 0o077 == 0
    assert all(path.stat().st_mode & 0o077 == 0 for path in (tmp_path / "cache").glob("*.pt"))


@pytest.mark.parametrize(("model", "message"), [
    ({"groups": 10}, "model.groups=10 must divide the 81"),
    ({"scales": 4}, "divisible by 16; the images are 8x8"),
    ({"max_order": 3}, "model.max_order must be 1 or 2"),
])
def test_refusals_name_the_setting(tmp_path, model, message):
    with pytest.raises(ConfigurationError, match=message):
        _digits_model(tmp_path, **model)
