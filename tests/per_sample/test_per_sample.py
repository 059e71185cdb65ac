"""Per-sample gradients and clipped sums of both engines against a per-example loop."""

import pytest
import torch
import torch.nn.functional as F

from dpbench.core.errors import UnsupportedModelError
from dpbench.core.tasks import ClassificationTask
from dpbench.models.cnn import LargeCNN
from dpbench.privatizers.per_sample import FunctorchEngine, HookEngine, MaterializedEngine, make_engine
from dpbench.privatizers.per_sample.sites import DenseSite
from tests.helpers.models import CASES

pytestmark = pytest.mark.models_as_built

TASK = ClassificationTask()


def loop_gradients(model, batch):
    inputs, targets = batch
    grads = []
    for i in range(targets.shape[0]):
        model.zero_grad()
        F.cross_entropy(model(inputs[i : i + 1]), targets[i : i + 1]).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    return grads


@pytest.mark.parametrize("engine_class", [HookEngine, FunctorchEngine])
@pytest.mark.parametrize("case", sorted(CASES))
def test_per_sample_gradients_match_loop(engine_class, case):
    torch.manual_seed(0)
    build, make_batch = CASES[case]
    model = build()
    batch = make_batch()
    reference = loop_gradients(model, batch)
    per_sample = engine_class(model).per_sample_gradients(TASK, batch)
    assert set(per_sample) == {n for n, _ in model.named_parameters()}
    for i, expected in enumerate(reference):
        for name, grad in expected.items():
            torch.testing.assert_close(per_sample[name][i], grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("engine_class", [HookEngine, FunctorchEngine, MaterializedEngine])
@pytest.mark.parametrize("case", sorted(CASES))
def test_clipped_sum_matches_loop(engine_class, case):
    torch.manual_seed(1)
    build, make_batch = CASES[case]
    model = build()
    batch = make_batch()
    reference = loop_gradients(model, batch)
    norms = torch.stack([torch.sqrt(sum(g.pow(2).sum() for g in r.values())) for r in reference])
    clip = float(norms.median())  # some samples clipped, some not
    result = engine_class(model).clipped_sum(TASK, batch, clip)
    torch.testing.assert_close(result.norms, norms, atol=1e-5, rtol=1e-4)
    for name, _ in model.named_parameters():
        expected = sum(min(1.0, clip / (float(n) + 1e-6)) * r[name] for n, r in zip(norms, reference, strict=True))
        torch.testing.assert_close(result.grads[name], expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_materialized_engine_builds_every_per_sample_gradient(case):
    """The papers' baseline holds (B, *shape) gradients for every parameter, embedding rows over the whole vocabulary
    included, where the hook engine keeps ghost norms and sparse rows."""
    build, make_batch = CASES[case]
    model = build()
    batch = make_batch()
    sites = MaterializedEngine(model).clipped_sites(TASK, batch, 1.0)[0]
    params = dict(model.named_parameters())
    for name, group in sites.items():
        assert all(isinstance(site, DenseSite) for site in group), name
        assert all(site.per_sample.shape[1:] == params[name].shape for site in group), name
    assert make_engine(model, "materialized").materialize


def test_ghost_and_dense_sites_agree_on_long_sequences():
    """The hook engine picks ghost norms for small T; forcing materialization must give the same result."""
    torch.manual_seed(2)
    build, make_batch = CASES["sequence"]
    model = build()
    batch = make_batch(length=3)
    engine = HookEngine(model)
    ghost = engine.clipped_sum(TASK, batch, 0.5)
    dense = engine.per_sample_gradients(TASK, batch)
    dense_norms = sum(g.flatten(1).pow(2).sum(1) for g in dense.values()).sqrt()
    torch.testing.assert_close(ghost.norms, dense_norms, atol=1e-5, rtol=1e-4)


def test_auto_engine_prefers_hooks_and_falls_back_to_functorch():
    assert isinstance(make_engine(CASES["cnn"][0]()).engine, HookEngine)
    recurrent = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GRU(4, 4))
    assert isinstance(make_engine(recurrent).engine, HookEngine)  # nn.RNN, nn.GRU and nn.LSTM have exact rules
    no_rule = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Bilinear(4, 4, 2))
    assert isinstance(make_engine(no_rule).engine, FunctorchEngine)
    with pytest.raises(UnsupportedModelError, match="Bilinear"):
        make_engine(no_rule, "hooks")


@pytest.mark.parametrize("engine", ["hooks", "functorch", "auto"])
def test_batchnorm_is_refused(engine):
    model = LargeCNN(width=16, hidden=8, normalization="batchnorm")
    with pytest.raises(UnsupportedModelError, match="BatchNorm2d.*GroupNorm"):
        make_engine(model, engine)
