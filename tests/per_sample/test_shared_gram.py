"""Issue 26: layers reading the same activations (attention's query, key and value) share one Gram of them in the
per-sample norms (norms.py), exactly: in float64 against each site's own ghost norm and against a per-example loop."""

from collections import Counter

import pytest
import torch

from dpbench.core.tasks import ClassificationTask
from dpbench.models.provenance import built_by_dpbench
from dpbench.privatizers.per_sample import HookEngine, norms
from dpbench.privatizers.per_sample.sites import DenseSite, OuterProductSite
from tests.helpers.per_sample_reference import loop_gradients, loop_norms
from tests.helpers.transformer_models import bert, image_batch, text_batch, vit

pytestmark = pytest.mark.models_as_built

TASK = ClassificationTask()


def test_sites_reading_one_activation_share_its_gram(monkeypatch):
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(4, 5, 6, generator=generator, dtype=torch.float64)
    grads = [torch.randn(4, 5, width, generator=generator, dtype=torch.float64) for width in (3, 3, 7)]
    shared = [OuterProductSite(a.view(4, 5, 6), g, torch.Size((g.shape[2], 6))) for g in grads]
    other = OuterProductSite(a.clone(), grads[0], torch.Size((3, 6)))  # equal values, other memory: not shared
    dense = DenseSite(torch.randn(4, 2, 2, generator=generator, dtype=torch.float64))
    groups = [[site] for site in shared] + [[other], [dense]]
    expected = sum(site.materialize().flatten(1).pow(2).sum(1) for site in [*shared, other, dense])
    calls = Counter()
    bmm = torch.bmm

    def counted(*args):
        calls["bmm"] += 1
        return bmm(*args)

    monkeypatch.setattr(norms.torch, "bmm", counted)
    got = norms.total_norm_sq(groups, torch.zeros(4, dtype=torch.float64))
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-12)
    assert calls["bmm"] == 4  # one Gram of a and one of the three gradients side by side, then the other site's two


def _shared_keys(monkeypatch) -> Counter:
    keys = Counter()
    memory = norms._memory

    def recorded(tensor):
        key = memory(tensor)
        keys[key] += 1
        return key

    monkeypatch.setattr(norms, "_memory", recorded)
    return keys


def test_attention_blocks_share_the_gram_and_match_a_per_example_loop(monkeypatch):
    for build, batch in [(vit, image_batch()), (bert, text_batch())]:
        torch.manual_seed(0)
        model = built_by_dpbench(build().double())  # the test's monkeypatch.undo() also undoes the marker's
        inputs, targets = batch
        batch = (inputs.double() if isinstance(inputs, torch.Tensor) else inputs, targets)
        reference = loop_norms(loop_gradients(model, batch))
        engine = HookEngine(model)
        keys = _shared_keys(monkeypatch)
        clipped = engine.clipped_sum(TASK, batch, float(reference.median()))
        torch.testing.assert_close(clipped.norms, reference, atol=1e-9, rtol=1e-9)
        assert max(keys.values()) >= 3  # query, key and value read one LayerNorm output
        monkeypatch.undo()
